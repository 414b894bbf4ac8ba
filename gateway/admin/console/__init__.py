"""The admin console: a static page at `/admin/ui` that drives the admin API with the operator's admin key.

The files are served without auth on purpose: they hold no data, and every call the page makes carries the
admin key as a Bearer token to `/admin/...`, where the gateway checks it.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import RedirectResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"
CONSOLE_PATH = "/admin/ui"


async def _to_index(request: Request) -> RedirectResponse:
    # Relative asset links in index.html resolve only under the trailing slash.
    return RedirectResponse(url=f"{CONSOLE_PATH}/", status_code=308)


def console_routes() -> list[BaseRoute]:
    """Routes serving the console at `/admin/ui/`; add them to the gateway's route list."""
    return [
        Route(CONSOLE_PATH, _to_index, methods=["GET", "HEAD"]),
        Mount(CONSOLE_PATH, app=StaticFiles(directory=STATIC_DIR, html=True), name="admin-console"),
    ]


__all__ = ["CONSOLE_PATH", "console_routes"]
