"""The backend server: one engine behind the OpenAI API, with health, metrics and one log line per request.

`tidegate backend` calls `main(args)`. The server listens at once and loads the model in the background;
`/health` answers 503 until the model is loaded and has served one warm-up request, then 200.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backend.engine.core import Engine
from backend.engine.engine_config import EngineConfig
from backend.engine.host import freeze_loaded_objects
from backend.engine.records import GenerateRequest
from backend.engine.sampling_params import SamplingParams
from backend.executor.model.config import UnsupportedModelError
from backend.loading.generation_config import generation_defaults
from backend.loading.model_cache import MODELS, ModelCacheError, resolve
from backend.server.api_errors import ApiError
from backend.server.metrics import CONTENT_TYPE, BackendMetrics
from backend.server.protocol import Endpoint
from backend.server.request_log import configure_logging
from backend.server.serving import OpenAIServing
from backend.server.tracing import setup_backend_tracing
from common import openapi
from common.connection_guard import ConnectionGuard, GuardedHttpProtocol
from config.backend import BackendSettings

OPENAPI = openapi.document("tidegate backend", gateway=False)

log = logging.getLogger("tidegate.backend.server")


def served_model_name(settings: BackendSettings, model_path: Path) -> str:
    """`--served-model-name` if given, the cache name for a named model, else the file's (or folder's) stem."""
    if settings.served_model_name:
        return settings.served_model_name
    if settings.model in MODELS:
        return settings.model
    return model_path.name if model_path.is_dir() else model_path.stem


class BackendServer:
    """Owns the engine's lifecycle and the routes; `app` is the ASGI application."""

    def __init__(self, settings: BackendSettings, model_path: Path, served_name: str) -> None:
        self.settings = settings
        self.model_path = model_path
        self.served_name = served_name
        self.created = int(time.time())
        self.engine: Engine | None = None
        self.load_error: str | None = None
        self.on_fatal: Callable[[], None] | None = None  # called when the model cannot load
        self.metrics = BackendMetrics(served_name, lambda: self.engine.stats() if self.engine else None)
        self.tracing = setup_backend_tracing(settings.tracing)
        self.serving = OpenAIServing(served_name, self.metrics, settings, self.tracing)
        self.app = Starlette(
            routes=[
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/metrics", self.metrics_text, methods=["GET"]),
                Route("/openapi.json", self.openapi, methods=["GET"]),
            ],
            lifespan=self._lifespan,
            exception_handlers={HTTPException: self.http_error},
        )
        self.app.state.connection_guard = ConnectionGuard()  # what the guarded protocol counts for this replica

    async def completions(self, request: Request) -> Response:
        return await self.serving.handle(request, Endpoint.COMPLETION)

    async def chat_completions(self, request: Request) -> Response:
        return await self.serving.handle(request, Endpoint.CHAT)

    async def models(self, request: Request) -> Response:
        card: dict[str, object] = {"id": self.served_name, "object": "model", "created": self.created,
                                   "owned_by": "tidegate", "root": str(self.model_path), "parent": None}
        if self.engine is not None:
            card["max_model_len"] = self.engine.max_model_len
            card["generation_defaults"] = self.serving.generation_defaults
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, request: Request) -> Response:
        if self.serving.engine is not None:
            return JSONResponse({"status": "ok"})
        if self.load_error is not None:
            return JSONResponse({"status": "failed", "error": self.load_error}, status_code=503)
        return JSONResponse({"status": "loading"}, status_code=503)

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(OPENAPI)

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def http_error(self, request: Request, exc: Exception) -> Response:
        """Unknown routes and wrong methods answer in the OpenAI error shape too."""
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        err = ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                       "invalid_request_error", code, None, dict(exc.headers or {}))
        return err.response()

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        loading = asyncio.create_task(self._load())
        try:
            yield
        finally:
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
            if self.engine is not None:
                await asyncio.to_thread(self.engine.shutdown)
            self.tracing.shutdown()

    async def _load(self) -> None:
        """Load the model off the event loop, warm it up with one real request, then open for traffic."""
        started = time.monotonic()
        try:
            settings = self.settings
            defaults = await asyncio.to_thread(generation_defaults, self.model_path, settings.generation_config,
                                               settings.override_generation_config)
            SamplingParams(**defaults)  # a default out of range fails the load, naming the field
            self.serving.generation_defaults = defaults
            self.engine = await asyncio.to_thread(Engine, EngineConfig.for_model(settings, self.model_path))
            self.engine.start()
            await self._warm_up(self.engine)
            freeze_loaded_objects()
        except Exception as exc:
            if isinstance(exc, UnsupportedModelError):  # the file's, not a bug: one line that names it, no traceback
                log.error("cannot serve %s: %s", self.model_path, exc)
            else:
                log.exception("loading %s failed", self.model_path)
            self.load_error = f"{type(exc).__name__}: {exc}"
            if self.on_fatal is not None:
                self.on_fatal()
            return
        self.serving.engine = self.engine
        log.info("model %s ready as %r in %.1fs (max_model_len %d, generation defaults %s, decode steps: %s)",
                 self.model_path, self.served_name, time.monotonic() - started, self.engine.max_model_len,
                 self.serving.generation_defaults,
                 "layers in one C++ call" if self.engine.runner.model.fused else "the Python layer loop")

    async def _warm_up(self, engine: Engine) -> None:
        prompt = engine.tokenizer.encode("Hello", add_special_tokens=True)
        request = GenerateRequest(f"warmup-{uuid.uuid4().hex}", prompt,
                                  SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        async for _ in engine.generate(request):
            pass


def create_app(settings: BackendSettings, model_path: Path, served_name: str) -> Starlette:
    """The ASGI app for one replica (the model loads when the app's lifespan starts)."""
    return BackendServer(settings, model_path, served_name).app


def main(args: argparse.Namespace) -> int:
    """Entry point of `tidegate backend`: resolve the model, then serve until interrupted."""
    settings: BackendSettings = args.settings.backend
    configure_logging(settings.log_level)
    log.info("torch CPU workers wait: %s", getattr(args, "cpu_wait", "as the environment says"))
    try:
        model_path = resolve(settings.model, args.settings.resolved_model_dir())
    except ModelCacheError as exc:
        log.error("tidegate backend: %s", exc)
        return 1
    backend = BackendServer(settings, model_path, served_model_name(settings, model_path))
    if settings.gateway_token_file is None and settings.host not in ("127.0.0.1", "::1", "localhost"):
        log.warning("no --gateway-token-file: any client that reaches %s:%d may set cache_salt and priority",
                    settings.host, settings.port)
    # the gateway's guarded protocol: a header deadline, a header size cap and a connection cap, at its defaults
    server = uvicorn.Server(uvicorn.Config(backend.app, host=settings.host, port=settings.port,
                                           log_level=settings.log_level, access_log=False, lifespan="on",
                                           timeout_graceful_shutdown=math.ceil(settings.drain_timeout),
                                           http=GuardedHttpProtocol))

    def stop() -> None:
        server.should_exit = True

    backend.on_fatal = stop
    server.run()
    return 1 if backend.load_error is not None else 0
