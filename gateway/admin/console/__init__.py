"""The admin console: a static page at `/admin/ui` that drives the admin API with the operator's admin key.

The files are served without auth on purpose: they hold no data, and every call the page makes carries the
admin key as a Bearer token to `/admin/...`, where the gateway checks it. Every answer carries a
Content-Security-Policy that allows only the console's own files (no inline script or style, no other origin) and
forbids framing, so that injected markup cannot run and another site cannot overlay the page (clickjacking).
"""

from __future__ import annotations

from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STATIC_DIR = Path(__file__).parent / "static"
CONSOLE_PATH = "/admin/ui"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
HEADERS = {"content-security-policy": CSP, "x-frame-options": "DENY", "x-content-type-options": "nosniff",
           "referrer-policy": "no-referrer"}
RAW_HEADERS = [(name.encode(), value.encode()) for name, value in HEADERS.items()]


def with_headers(app: ASGIApp) -> ASGIApp:
    """`app` with the console's security headers on every answer."""
    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *RAW_HEADERS]
            await send(message)
        try:
            await app(scope, receive, send_with)
        except HTTPException as exc:  # a missing file: the app's error answer, with the headers too
            raise HTTPException(exc.status_code, exc.detail, {**(exc.headers or {}), **HEADERS}) from None
    return wrapped


async def _to_index(request: Request) -> RedirectResponse:
    # Relative asset links in index.html resolve only under the trailing slash.
    return RedirectResponse(url=f"{CONSOLE_PATH}/", status_code=308, headers=HEADERS)


def console_routes() -> list[BaseRoute]:
    """Routes serving the console at `/admin/ui/`; add them to the gateway's route list."""
    return [
        Route(CONSOLE_PATH, _to_index, methods=["GET", "HEAD"]),
        Mount(CONSOLE_PATH, app=with_headers(StaticFiles(directory=STATIC_DIR, html=True)), name="admin-console"),
    ]


__all__ = ["CONSOLE_PATH", "console_routes"]
