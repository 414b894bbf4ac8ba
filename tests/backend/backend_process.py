"""A real `tidegate backend` subprocess on a loopback port, for the server's end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import ChildProcess, backend_argv, free_port, wait_for_port


class BackendProcess(ChildProcess):
    """One server; `first_health` is the /health answer seen as soon as the port opened (before loading)."""

    def __init__(self, model_path: Path, log_path: Path, args: Sequence[str] = (),
                 env: dict[str, str] | None = None) -> None:
        port = free_port()
        super().__init__(backend_argv(model_path, port, *args), log_path, port, env or {})
        self.first_health: tuple[int, dict[str, Any]] | None = None
        self._watcher: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def launch(self) -> Self:
        """Start the process and return at once; a thread notes the first /health answer once it listens."""
        super().launch()
        self._watcher = threading.Thread(target=self._note_first_health, daemon=True)
        self._watcher.start()
        return self

    def wait_ready(self, timeout: float = 180.0) -> Self:
        """Block until /health answers 200; on failure stop the process and show its log."""
        self.wait_healthy(timeout)
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        return self

    def _note_first_health(self) -> None:
        with contextlib.suppress(TimeoutError, httpx.HTTPError, ValueError):
            wait_for_port(self.port, timeout=120.0)
            answer = httpx.get(self.url + "/health", timeout=5.0)
            self.first_health = (answer.status_code, answer.json())

    def stop(self, timeout: float = 15.0) -> None:
        super().stop(timeout)

    def request_lines(self) -> list[dict[str, Any]]:
        """The structured per-request log lines written so far."""
        lines = []
        for line in self.log().splitlines():
            if line.startswith("{") and '"event":"request"' in line:
                lines.append(json.loads(line))
        return lines

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics by name and labels, e.g. `tidegate_backend_num_requests_running`."""
        text = httpx.get(self.url + "/metrics", timeout=5.0).text
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                extra = {k: v for k, v in sample.labels.items() if k != "model_name"}
                key = sample.name + (json.dumps(extra, sort_keys=True) if extra else "")
                samples[key] = sample.value
        return samples

    def wait_idle(self, idle_kv_usage: float, timeout: float = 10.0) -> dict[str, float]:
        """Poll /metrics until nothing runs or waits and KV usage is back to `idle_kv_usage`."""
        deadline = time.monotonic() + timeout
        while True:
            metrics = self.metrics()
            idle = (metrics["tidegate_backend_num_requests_running"] == 0
                    and metrics["tidegate_backend_num_requests_waiting"] == 0
                    and metrics["tidegate_backend_kv_cache_usage_perc"] <= idle_kv_usage)
            if idle or time.monotonic() > deadline:
                return metrics
            time.sleep(0.05)
