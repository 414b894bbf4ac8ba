"""The OpenAI error shape both tiers answer with: one `ApiError` turned into one JSON response.

Kept outside both tiers so that their bodies and `Retry-After` headers stay identical, which the gateway's relay
and the openai SDK rely on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.responses import JSONResponse


@dataclass(slots=True)
class ApiError(Exception):
    """An error the client must see, with the status and OpenAI `type`/`code` its SDK maps to an exception."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, request_id: str | None = None) -> JSONResponse:
        headers = dict(self.headers)
        if request_id:
            headers["x-request-id"] = request_id
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def unavailable(message: str, retry_after: float | None = None, code: str = "service_unavailable") -> ApiError:
    headers = retry_after_headers(retry_after) if retry_after is not None else {}
    return ApiError(503, message, "service_unavailable", code, None, headers)


def retry_after_headers(seconds: float) -> dict[str, str]:
    """`Retry-After` in whole seconds (HTTP), and in milliseconds for clients that read `retry-after-ms`."""
    whole = max(1, int(-(-seconds // 1)))
    return {"retry-after": str(whole), "retry-after-ms": str(max(1, int(seconds * 1000)))}
