"""The gateway: auth, admission, priority queues, routing over channels, upstream calls and the relay."""

from gateway.app import Gateway, create_app, create_app_from_env
from gateway.errors import ApiError

__all__ = ["ApiError", "Gateway", "create_app", "create_app_from_env"]
