"""A real `tidegate backend` serving SmolLM2 behind a real `tidegate gateway` process, both on loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from tests.backend.backend_process import BackendProcess
from tests.servers import ChildProcess, free_port, tidegate_argv

ADMIN_KEY = "live-stack-admin-4d8e2b7a9c1f3e5a6b0d7c2e"  # 32+ characters, as the gateway requires


@dataclass(slots=True)
class LiveStack:
    url: str
    backend: BackendProcess

    def client(self, secret: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=secret, max_retries=0, timeout=60)


@contextmanager
def live_stack(workdir: Path, model_path: Path, gateway: dict[str, Any] | None = None,
               env: dict[str, str] | None = None, channel: dict[str, Any] | None = None,
               backend: BackendProcess | None = None) -> Iterator[LiveStack]:
    """Backend and gateway (embedded store, revocation seen on the next request) started side by side.

    `gateway` adds to the gateway's YAML config, `channel` to its one channel's; `env` goes to both processes.
    A `backend` already running is used (and left running) instead of a new one.
    """
    own_backend = backend is None
    if backend is None:
        backend = BackendProcess(model_path, workdir / "backend.log", env=env).launch()
    port = free_port()
    config = workdir / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "admin_key": ADMIN_KEY,
        "data_dir": str(workdir / "data"),
        "auth_cache_ttl": 0,
        "health_check_interval": 0.5,  # the backend turns healthy after the gateway's first check
        "channels": [{"name": "local-1", "base_url": backend.base_url, "models": ["smollm2"], **(channel or {})}],
        **(gateway or {}),
    }))
    gateway_process = ChildProcess(tidegate_argv("gateway", "--config", str(config), "--port", str(port)),
                                   workdir / "gateway.log", port, env or {})
    try:
        gateway_process.launch()
        backend.wait_ready()
        gateway_process.wait_healthy(timeout=60)
        _wait_for_healthy_channel(gateway_process.url)
        yield LiveStack(gateway_process.url, backend)
    finally:
        gateway_process.stop()
        if own_backend:
            backend.stop()


def _wait_for_healthy_channel(url: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(f"{url}/health", timeout=5).json().get("healthy_channels", 0) < 1:
        if time.monotonic() > deadline:
            raise TimeoutError("the gateway never saw its backend channel healthy")
        time.sleep(0.1)
