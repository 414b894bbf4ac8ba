"""The Files and Batch APIs of one replica, built from the gateway's parts: its store, its one request path and
its priority pools, with the dispatcher that runs batch lines through them."""

from __future__ import annotations

from starlette.routing import Route

from config import GatewaySettings
from gateway.apis.openai import CHAT, COMPLETIONS, EMBEDDINGS
from gateway.apis.responses.api import ResponsesApi, ResponseTurn
from gateway.batch.batches import BatchesApi
from gateway.batch.dispatcher import Dispatcher
from gateway.batch.files import FilesApi
from gateway.batch.finalize import Finalizer
from gateway.batch.folder import FileFolder
from gateway.batch.line_runner import LineRunner, WireFor
from gateway.batch.metrics import BatchMetrics
from gateway.batch.pressure import Pressure
from gateway.observe.metrics import GatewayMetrics
from gateway.path.priority import PriorityPools
from gateway.path.proxy import Proxy
from quota import BatchStore, QuotaService


class BatchApis:
    def __init__(self, settings: GatewaySettings, quota: QuotaService, store: BatchStore, proxy: Proxy,
                 pools: PriorityPools, responses: ResponsesApi, metrics: GatewayMetrics):
        batch = settings.batch
        self.store = store
        folder = FileFolder(batch.folder(settings.resolved_data_dir()))
        self.files = FilesApi(batch, quota, store, folder)
        self.batches = BatchesApi(batch, quota, store, self.files)
        wires: dict[str, WireFor] = {"/v1/chat/completions": lambda: CHAT, "/v1/completions": lambda: COMPLETIONS,
                                     "/v1/embeddings": lambda: EMBEDDINGS,
                                     "/v1/responses": lambda: ResponseTurn(responses.store)}
        runner = LineRunner(proxy, pools, wires)
        self.dispatcher = Dispatcher(batch, store, quota, folder, runner,
                                     Pressure(batch, pools, runner.priority_class),
                                     Finalizer(store, self.files, batch.lease_seconds),
                                     BatchMetrics(metrics.registry))
        self._enabled = batch.enabled

    def routes(self) -> list[Route]:
        return [*self.files.routes(), *self.batches.routes()] if self._enabled else []

    def start(self) -> None:
        if self._enabled:
            self.dispatcher.start()

    async def close(self) -> None:
        await self.dispatcher.stop()
        await self.store.close()
