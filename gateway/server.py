"""`tidegate gateway`: serve the app with uvicorn, in one process or several worker processes."""

from __future__ import annotations

import argparse
import logging
import math
from typing import Any

import uvicorn

from common.connection_guard import GuardedHttpProtocol
from config import GatewaySettings
from config.admin_key import required_admin_key
from config.secret_files import with_metrics_token
from gateway.path.request_extras import salt_secret
from gateway.worker_settings import settings_for_workers


def main(args: argparse.Namespace) -> int:
    settings: GatewaySettings = args.settings.gateway
    logging.basicConfig(level=settings.log_level.upper(), format="%(message)s")
    # refuses to start (SettingsError: one line, exit 2) without a strong admin key
    admin_key = required_admin_key(settings)
    settings = settings.model_copy(update={"admin_key": admin_key, "admin_key_file": None})
    salt_secret(settings)  # created here, once, so that worker processes read one secret instead of racing
    settings = with_metrics_token(settings, generate=True)
    if settings.metrics_token is None:
        logging.getLogger("tidegate.gateway").warning("/metrics is public (metrics_public): anyone who reaches "
                                                      "the port reads its volumes")
    if not settings.channels:
        logging.getLogger("tidegate.gateway").warning("no channels configured: every model answers 404")
    with settings_for_workers(settings):
        uvicorn.run("gateway.app:create_app_from_env", factory=True, host=settings.host, port=settings.port,
                    workers=settings.workers, log_level=settings.log_level, access_log=False,
                    timeout_graceful_shutdown=drain_seconds(settings), **uvicorn_options(settings))
    return 0


def drain_seconds(settings: GatewaySettings) -> int:
    """How long SIGTERM waits for requests in flight: the longest total deadline of any configured channel.

    The listener closes at once; a stream still running after this is cut (a Kubernetes grace period should
    cover it, see deploy/).
    """
    totals = [settings.timeouts.total, *(settings.channel_timeouts(c).total for c in settings.channels)]
    return math.ceil(max(totals))


def uvicorn_options(settings: GatewaySettings) -> dict[str, Any]:
    """What every gateway server runs with, in every worker: the guarded HTTP protocol and its keep-alive, and no
    proxy headers (uvicorn would believe X-Forwarded-For from loopback): `trusted_proxies` decides, in the app."""
    return {"http": GuardedHttpProtocol, "timeout_keep_alive": settings.server.keep_alive_timeout,
            "proxy_headers": False}
