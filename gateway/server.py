"""`tidegate gateway`: serve the app with uvicorn, in one process or several worker processes."""

from __future__ import annotations

import argparse
import logging
import os

import uvicorn

from config import GatewaySettings
from gateway.app import SETTINGS_ENV


def main(args: argparse.Namespace) -> int:
    settings: GatewaySettings = args.settings.gateway
    logging.basicConfig(level=settings.log_level.upper(), format="%(message)s")
    if not settings.channels:
        logging.getLogger("tidegate.gateway").warning("no channels configured: every model answers 404")
    # workers are fresh processes: they rebuild the same settings from this variable
    os.environ[SETTINGS_ENV] = settings.model_dump_json()
    uvicorn.run("gateway.app:create_app_from_env", factory=True, host=settings.host, port=settings.port,
                workers=settings.workers, log_level=settings.log_level, access_log=False,
                timeout_graceful_shutdown=5)
    return 0
