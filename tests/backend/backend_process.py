"""A real `tidegate backend` subprocess on a loopback port, for the server's end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import free_port, stop_process, wait_for_health, wait_for_port

REPO = Path(__file__).resolve().parents[2]


@dataclass
class BackendProcess:
    """One server; `first_health` is the /health answer seen as soon as the port opened (before loading)."""

    model_path: Path
    log_path: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    first_health: tuple[int, dict[str, Any]] | None = None
    _watcher: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def start(self, timeout: float = 180.0) -> BackendProcess:
        return self.launch().wait_ready(timeout)

    def launch(self) -> BackendProcess:
        """Start the process and return at once; a thread notes the first /health answer once it listens.

        One torch thread: on a machine shared with other test runs, two threads per process oversubscribe the
        cores and run several times slower (a later `--threads` in `args` wins).
        """
        cmd = [sys.executable, "-m", "tidegate", "backend", "--model", str(self.model_path),
               "--served-model-name", "smollm2", "--port", str(self.port), "--threads", "1", *self.args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        self._watcher = threading.Thread(target=self._note_first_health, daemon=True)
        self._watcher.start()
        return self

    def wait_ready(self, timeout: float = 180.0) -> BackendProcess:
        """Block until /health answers 200; on failure stop the process and show its log."""
        try:
            wait_for_health(self.url + "/health", timeout=timeout, proc=self.proc)
        except BaseException:
            self.stop()
            raise RuntimeError(f"backend failed to start; log:\n{self.log_text()[-4000:]}") from None
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        return self

    def _note_first_health(self) -> None:
        with contextlib.suppress(TimeoutError, httpx.HTTPError, ValueError):
            wait_for_port(self.port, timeout=120.0)
            answer = httpx.get(self.url + "/health", timeout=5.0)
            self.first_health = (answer.status_code, answer.json())

    def stop(self) -> None:
        stop_process(self.proc, timeout=15)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request_lines(self) -> list[dict[str, Any]]:
        """The structured per-request log lines written so far."""
        lines = []
        for line in self.log_text().splitlines():
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
