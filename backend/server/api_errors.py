"""The backend's refusals, as the same OpenAI-shaped `ApiError` the gateway answers with.

One error type for both tiers keeps their bodies and `Retry-After` headers identical, which the gateway's
relay and the openai SDK both rely on.
"""

from __future__ import annotations

from common.openai_errors import ApiError, unavailable

__all__ = ["ApiError", "internal", "invalid", "model_not_found", "unavailable", "unsupported"]


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 for a client's mistake; `param` names the offending field as OpenAI does."""
    return ApiError(400, message, "invalid_request_error", code, param)


def unsupported(param: str, what: str) -> ApiError:
    return invalid(f"`{param}` {what} is not supported by this server", param, "unsupported_parameter")


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist.", "invalid_request_error", "model_not_found",
                    "model")


def internal(request_id: str) -> ApiError:
    """A failure of ours: the client learns the request id to quote, never the internals."""
    return ApiError(500, f"internal server error (request id {request_id})", "server_error", "internal_error")
