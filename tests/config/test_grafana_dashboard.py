"""The Grafana dashboard queries only metrics that the gateway and the backend really export."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from backend.engine.records import EngineStats
from backend.server.metrics import BackendMetrics
from config import GatewaySettings
from gateway.app import create_app

DASHBOARD = Path(__file__).parents[2] / "config" / "grafana" / "tidegate-dashboard.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def series_names(exposition: str) -> set[str]:
    """Every sample name a Prometheus scrape of `exposition` can hold, empty labelled families included."""
    names = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def gateway_series(tmp_path: Path) -> set[str]:
    settings = GatewaySettings(data_dir=tmp_path, admin_key="dashboard-admin-5e2a9d7c1b8f4036a2e9c7d1", channels=[
        {"name": "local-1", "base_url": "http://127.0.0.1:9/v1", "models": ["smollm2"]}])
    with TestClient(create_app(settings)) as client:
        return series_names(client.get("/metrics").text)


def backend_series() -> set[str]:
    stats = EngineStats(num_running=1, num_waiting=0, kv_blocks_total=64, kv_blocks_free=60, kv_usage=0.06,
                        prefix_cache_queries=10, prefix_cache_hits=4, num_preemptions=0, steps=7)
    return series_names(BackendMetrics("smollm2", lambda: stats).render().decode())


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def test_every_query_names_an_exported_metric(tmp_path: Path) -> None:
    exported = gateway_series(tmp_path) | backend_series()
    queried = {name for expr in dashboard_queries() for name in re.findall(r"\btidegate_[a-z0-9_]+", expr)}
    assert queried, "the dashboard queries nothing"
    assert sorted(queried - exported) == []


def test_dashboard_covers_both_tiers_with_unique_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert {p["title"] for p in panels if p["type"] == "row"} == {"Gateway", "Channels", "Backend replicas"}
    for panel in panels:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
            assert panel["targets"], panel["title"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "model"}
