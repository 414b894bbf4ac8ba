"""The gateway: auth, admission, priority queues, routing over channels, upstream calls and the relay."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.app import Gateway, create_app, create_app_from_env
    from gateway.errors import ApiError

__all__ = ["ApiError", "Gateway", "create_app", "create_app_from_env"]


def __getattr__(name: str) -> Any:
    # imported on first use, so that `tidegate admin` (tidegate.admin.cli) does not load the whole server
    if name == "ApiError":
        from gateway.errors import ApiError

        return ApiError
    if name in __all__:
        import gateway.app

        return getattr(gateway.app, name)
    raise AttributeError(f"module 'gateway' has no attribute {name!r}")
