"""OpenAI-shaped errors: every refusal the gateway makes is one `ApiError` turned into one JSON response."""

from __future__ import annotations

from common.openai_errors import ApiError, retry_after_headers, unavailable

__all__ = ["ApiError", "forbidden", "gateway_timeout", "invalid_request", "not_found", "retry_after_headers",
           "unauthorized", "unavailable"]


def invalid_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", None, param)


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, "invalid_request_error", "invalid_api_key")


def forbidden(message: str, code: str) -> ApiError:
    return ApiError(403, message, "permission_error", code)


def not_found(message: str, code: str = "not_found") -> ApiError:
    return ApiError(404, message, "invalid_request_error", code)


def gateway_timeout(message: str) -> ApiError:
    return ApiError(504, message, "timeout", "upstream_timeout")
