"""The gateway's Starlette app: built from settings, or in a worker process from settings in the environment."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from functools import partial
from http import HTTPStatus

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from common import openapi
from common.connection_guard import ConnectionGuard, ConnectionLimits
from common.heap import settle_for_serving
from common.http_client import HttpClient
from config import GatewaySettings
from config.admin_key import configured_admin_key
from config.secret_files import with_channel_keys, with_metrics_token
from gateway.admin.api import AdminApi
from gateway.admin.console import console_routes
from gateway.admin.money import seed_prices
from gateway.admin.write_limit import AdminWriteLimit
from gateway.apis.mcp_connector import MessagesApi
from gateway.apis.openai import CHAT, COMPLETIONS, EMBEDDINGS, models_endpoint
from gateway.apis.responses.api import ResponsesApi
from gateway.apis.responses.store import open_response_store
from gateway.auth import check_token
from gateway.batch import BatchApis
from gateway.channels.breaker_sync import BreakerSync
from gateway.channels.limits import ChannelLimits
from gateway.channels.registry import ChannelRegistry
from gateway.channels.router import Router
from gateway.channels.state import ChannelState, HealthChecker
from gateway.channels.throughput import ThroughputWatch
from gateway.errors import ApiError
from gateway.mcp.calls import McpCalls
from gateway.mcp.federation import McpFederation
from gateway.mcp.registry import KIND as MCP_KIND
from gateway.mcp.registry import McpRegistry
from gateway.observe.metrics import ChannelLive, GatewayMetrics, LiveState
from gateway.observe.tracing import setup_tracing
from gateway.path.direct_entry import Endpoint, GatewayApp
from gateway.path.priority import PriorityPools
from gateway.path.proxy import Proxy
from gateway.path.upstream import UpstreamClient
from gateway.worker_settings import read_worker_settings
from limiter import MemoryCapacity, RedisCapacity
from quota import (
    QuotaService,
    open_batch_store,
    open_record_store,
    open_redis,
    open_routing_store,
    open_store,
)

OPENAPI = openapi.document("tidegate gateway", gateway=True)


class Gateway:
    """Everything one worker process holds: the store, channels, pools and the upstream connection pool."""

    def __init__(self, settings: GatewaySettings, quota: QuotaService, connections: ConnectionGuard):
        self.settings = settings
        self.quota = quota
        self.http = httpx.AsyncClient()  # health checks only
        # upstream calls: a purpose-built client costs a fraction of a general one's CPU per request; it keeps no
        # cookies, so nothing an upstream sets for one tenant rides along on another's request
        self.session = HttpClient()
        channels = [ChannelState(c, settings.channel_timeouts(c), settings.breaker) for c in settings.channels]
        self.router = Router(channels, groups=settings.model_groups, routing=settings.routing)
        # the store's channels and groups replace the config file's once read (see channel_registry.py)
        self.registry = ChannelRegistry(open_routing_store(settings), settings, self.router)
        self.pools = PriorityPools(settings.priority_classes, settings.default_priority_class)
        self.connections = connections
        self.metrics = GatewayMetrics(self.router.serves, self.live_state, settings.metrics_per_account)
        self.redis = open_redis(settings.redis_url, timeout=settings.redis_timeout) if settings.redis_url else None
        capacity = MemoryCapacity() if self.redis is None else RedisCapacity(self.redis, settings.gateway_replicas)
        self.throughput = ThroughputWatch(self.router, self.http, settings.health_check_interval,
                                          settings.health_check_timeout)
        limits = ChannelLimits(settings, capacity, self.throughput)
        upstream = UpstreamClient(self.router, settings.retries, self.session, limits=limits)
        self.tracing = setup_tracing(settings.tracing)
        self.proxy = Proxy(settings, quota, self.router, upstream, self.pools, self.metrics, self.tracing)
        self.mcp = McpRegistry(open_record_store(settings, MCP_KIND), settings.mcp_servers, settings.breaker,
                               self._set_tool_price)
        self.mcp_calls = McpCalls(self.mcp, quota, self.metrics, self.tracing, max(0.5, settings.lease_ttl / 3))
        self.responses = ResponsesApi(self.proxy, quota, open_response_store(settings, self.redis), self.mcp_calls)
        self.messages = MessagesApi(self.proxy, quota, self.mcp_calls)
        self.federation = McpFederation(self.mcp_calls, quota, settings.max_body_bytes, settings.server.body_timeout)
        self._serving = contextlib.AsyncExitStack()
        self.batch = BatchApis(settings, quota, open_batch_store(settings), self.proxy, self.pools, self.responses,
                               self.metrics)
        self.admin = AdminApi(quota, self.registry, configured_admin_key(settings),
                              tuple(settings.priority_classes), settings.currency,
                              AdminWriteLimit(settings.admin_limits.writes_per_minute, self.redis), self.mcp,
                              batches=self.batch.store)
        self.health = HealthChecker(self.router.channels, settings.health_check_interval, self.http,
                                    settings.health_check_timeout, settings.unhealthy_threshold)
        self.breaker_sync = None
        if self.redis is not None:
            self.breaker_sync = BreakerSync(self.redis, self.router.channels, settings.breaker.cooldown)

    async def start(self) -> None:
        await self.registry.start()
        await self.mcp.start()
        await self._serving.enter_async_context(self.federation.running())
        self.health.start()
        self.throughput.poller.start()  # polls only channels with rate_from: metrics (run-time ones too)
        if self.breaker_sync is not None:
            self.breaker_sync.start()
        self.batch.start()

    async def close(self) -> None:
        await self.batch.close()
        await self._serving.aclose()
        await self.mcp.stop()
        await self.registry.stop()
        await self.health.stop()
        await self.throughput.poller.stop()
        if self.breaker_sync is not None:
            await self.breaker_sync.stop()
        await self.http.aclose()
        await self.session.close()
        await self.responses.store.close()
        await self.quota.close()
        self.tracing.shutdown()

    async def _set_tool_price(self, name: str, per_call: float) -> None:
        # one call is charged as one input token: the per-million price is the per-call price times a million
        await self.quota.money.set_price(name, {"input": per_call * 1_000_000, "output": 0})

    def live_state(self) -> LiveState:
        """What a metrics scrape reads: channels, breakers, priority queues, the store and connections."""
        channels = [ChannelLive(c.name, c.in_flight, c.healthy,
                                {model: c.breaker(model).state.value for model in c.config.models})
                    for c in self.router.channels]
        return LiveState(channels, {name: (pool.active, pool.queued) for name, pool in self.pools.pools.items()},
                         self.quota.degraded, self.connections.open, dict(self.connections.closed),
                         dict(self.router.affinity.overrides))

    async def health_route(self, request: Request) -> Response:
        healthy = sum(1 for c in self.router.channels if c.healthy)
        return JSONResponse({"status": "ok", "degraded": self.quota.degraded, "channels": len(self.router.channels),
                             "healthy_channels": healthy, "priority": self.pools.status()})

    async def metrics_route(self, request: Request) -> Response:
        if self.settings.metrics_token is not None:
            try:
                check_token(request, self.settings.metrics_token, "metrics token")
            except ApiError as error:
                return error.response()
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def openapi_route(self, request: Request) -> Response:
        return JSONResponse(OPENAPI)

    def inference(self) -> dict[str, Endpoint]:
        """The POST routes every inference request takes: each inbound API is a wire that the one path serves."""
        return {"/v1/chat/completions": partial(self.proxy.serve, wire=CHAT),
                "/v1/completions": partial(self.proxy.serve, wire=COMPLETIONS),
                "/v1/messages": self.messages.create,  # the one path, or the MCP connector's loop over it
                "/v1/embeddings": partial(self.proxy.serve, wire=EMBEDDINGS)}

    def routes(self) -> list[BaseRoute]:
        return [
            *(Route(path, endpoint, methods=["POST"]) for path, endpoint in self.inference().items()),
            *self.responses.routes(),
            *self.batch.routes(),
            *self.federation.routes(),
            Route("/v1/models", models_endpoint(self.quota, self.router), methods=["GET"]),
            Route("/health", self.health_route, methods=["GET"]),
            Route("/metrics", self.metrics_route, methods=["GET"]),
            Route("/openapi.json", self.openapi_route, methods=["GET"]),
            *console_routes(),
            *self.admin.routes(),
        ]


def create_app(settings: GatewaySettings, *, worker: bool = False) -> Starlette:
    """The app; the store opens and the health checks start when the server starts it (lifespan). A `worker`
    process (the server's) owns its heap: its start-up objects are frozen out of garbage collection."""
    settings = with_metrics_token(with_channel_keys(settings), generate=False)  # the server made it (server.py)
    app = GatewayApp(trusted=settings.all_trusted_proxies(), ip_limit=settings.ip_rate_limit,
                     internal_error=_internal_error, routing_error=_routing_error)
    limits = settings.server
    # read by the server's HTTP protocol (common.connection_guard) for every connection it accepts
    guard = ConnectionGuard(ConnectionLimits(limits.header_timeout, limits.max_header_bytes, limits.max_connections))
    app.state.connection_guard = guard

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        gateway = Gateway(settings, await open_store(settings), guard)
        await gateway.quota.money.seed_prices(seed_prices(settings.prices))
        app.state.gateway = gateway
        app.router.routes.extend(gateway.routes())
        app.direct.update(gateway.inference())
        await gateway.start()
        if worker:
            settle_for_serving()  # the app and its state live as long as the process: no collection rescans them
        try:
            yield
        finally:
            await gateway.close()

    app.router.lifespan_context = lifespan
    return app


async def _internal_error(request: Request, exc: Exception) -> Response:
    # a bug still answers in the OpenAI shape, so SDKs raise their error class instead of failing to parse
    logging.getLogger("tidegate.gateway").exception("unhandled error on %s", request.url.path, exc_info=exc)
    return ApiError(500, "internal gateway error", "server_error", "internal_error").response()


async def _routing_error(request: Request, exc: Exception) -> Response:
    # unknown paths and methods answer in the OpenAI shape too, without echoing the path
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    headers = dict(exc.headers or {}) if isinstance(exc, HTTPException) else {}
    phrase = HTTPStatus(status).phrase
    return ApiError(status, f"{phrase}: see /openapi.json for the routes and their methods",
                    "invalid_request_error", phrase.lower().replace(" ", "_"), None, headers).response()


def create_app_from_env() -> Starlette:
    """The factory each uvicorn worker calls: settings travel from the parent in a private file."""
    settings = read_worker_settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(message)s")
    return create_app(settings, worker=True)
