"""The stack's parts as real processes, for faults that only a process boundary shows (SIGKILL, RSS, restarts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.servers import ChildProcess, backend_argv, free_port, tidegate_argv

ADMIN_KEY = "reliability-admin-1a6f4c8e2d9b7305e4c1a8f6"  # 32+ characters, as the gateway requires
METRICS_TOKEN = "reliability-metrics-5b2e8c1d7a4f"

Process = ChildProcess  # the name these tests know it by


def backend_process(tmp_path: Path, model_path: Path, name: str = "backend", port: int | None = None,
                    *extra: str) -> ChildProcess:
    port = port or free_port()
    return ChildProcess(backend_argv(model_path, port, *extra), tmp_path / f"{name}.log", port)


@dataclass
class GatewayProcess(ChildProcess):
    """A `tidegate gateway` child with an admin client; config written from `settings`."""

    settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(cls, tmp_path: Path, upstream_urls: list[str], redis_url: str | None = None,
               channel_max_concurrency: int = 64, **settings: Any) -> GatewayProcess:
        port = free_port()
        config: dict[str, Any] = {
            "admin_key": ADMIN_KEY, "data_dir": str(tmp_path / "gateway-data"), "port": port,
            "metrics_token": METRICS_TOKEN,
            "health_check_interval": 0.5,
            "channels": [{"name": f"c{i}", "base_url": url, "models": ["smollm2"],
                          "max_concurrency": channel_max_concurrency} for i, url in enumerate(upstream_urls)],
            **settings,
        }
        if redis_url:
            config["redis_url"] = redis_url
        path = tmp_path / f"gateway-{port}.yaml"
        path.write_text(yaml.safe_dump(config))
        return cls(tidegate_argv("gateway", "--config", str(path)), tmp_path / f"gateway-{port}.log", port,
                   settings=config)

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)

    def new_key(self, quota: dict[str, int] | None = None, **fields: Any) -> tuple[str, str]:
        """(key id, secret) of a key on a new account; `quota` applies to the key."""
        with self.admin() as admin:
            account = admin.post("/admin/accounts", json={"name": "tenant"})
            account.raise_for_status()
            body: dict[str, Any] = {"account_id": account.json()["id"], **fields}
            if quota:
                body["quota"] = quota
            key = admin.post("/admin/keys", json=body)
            key.raise_for_status()
            return str(key.json()["id"]), str(key.json()["key"])

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10,
                         headers={"authorization": f"Bearer {METRICS_TOKEN}"}).text


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample, 0.0 when absent; labels must match exactly those given."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_text = head.partition("{")
        if metric != name:
            continue
        found = dict(part.split("=", 1) for part in label_text.rstrip("}").split(",") if "=" in part)
        found = {k: v.strip('"') for k, v in found.items()}
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total
