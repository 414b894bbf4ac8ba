"""`tidegate gateway`: serve the app with uvicorn, in one process or several worker processes."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

import uvicorn

from config import GatewaySettings
from gateway.app import SETTINGS_ENV
from tidegate.connection_guard import GuardedHttpProtocol


def main(args: argparse.Namespace) -> int:
    settings: GatewaySettings = args.settings.gateway
    logging.basicConfig(level=settings.log_level.upper(), format="%(message)s")
    if not settings.channels:
        logging.getLogger("tidegate.gateway").warning("no channels configured: every model answers 404")
    # workers are fresh processes: they rebuild the same settings from this variable
    os.environ[SETTINGS_ENV] = settings.model_dump_json()
    uvicorn.run("gateway.app:create_app_from_env", factory=True, host=settings.host, port=settings.port,
                workers=settings.workers, log_level=settings.log_level, access_log=False,
                timeout_graceful_shutdown=5, **uvicorn_options(settings))
    return 0


def uvicorn_options(settings: GatewaySettings) -> dict[str, Any]:
    """What every gateway server runs with, in every worker: the guarded HTTP protocol and its keep-alive."""
    return {"http": GuardedHttpProtocol, "timeout_keep_alive": settings.server.keep_alive_timeout}
