"""Backend metrics: per-request counters and histograms, and engine gauges read live at scrape time."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from backend.engine.records import EngineStats, RequestTimings
from backend.server.metrics import BackendMetrics


def samples(metrics: BackendMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def one(values: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return values[(name, tuple(sorted({"model_name": "m", **labels}.items())))]


def test_a_finished_request_feeds_tokens_reasons_and_latency_histograms() -> None:
    metrics = BackendMetrics("m", lambda: None)
    timings = RequestTimings(queued=10.0, scheduled=10.5, first_token=11.0, finished=12.0,
                             token_times=[11.0, 11.5, 12.0])
    metrics.request_finished(20, 3, "length", timings)
    metrics.request_finished(5, 0, "abort", None)
    metrics.request_rejected("overloaded")
    v = samples(metrics)
    assert one(v, "tidegate_backend_prompt_tokens_total") == 25
    assert one(v, "tidegate_backend_generation_tokens_total") == 3
    assert one(v, "tidegate_backend_request_success_total", finished_reason="length") == 1
    assert one(v, "tidegate_backend_request_success_total", finished_reason="abort") == 1
    assert one(v, "tidegate_backend_request_rejected_total", reason="overloaded") == 1
    assert one(v, "tidegate_backend_request_queue_time_seconds_sum") == 0.5
    assert one(v, "tidegate_backend_time_to_first_token_seconds_sum") == 1.0
    assert one(v, "tidegate_backend_e2e_request_latency_seconds_sum") == 2.0
    assert one(v, "tidegate_backend_inter_token_latency_seconds_count") == 2


def test_engine_gauges_are_read_at_scrape_time_and_absent_while_loading() -> None:
    stats: list[EngineStats | None] = [None]
    metrics = BackendMetrics("m", lambda: stats[0])
    assert not any(name == "tidegate_backend_num_requests_running" for name, _ in samples(metrics))
    stats[0] = EngineStats(num_running=3, num_waiting=2, kv_blocks_total=100, kv_blocks_free=75, kv_usage=0.25,
                           prefix_cache_queries=64, prefix_cache_hits=32, num_preemptions=1, steps=9,
                           spec_draft_tokens=40, spec_accepted_tokens=25, spec_emitted_tokens=35)
    v = samples(metrics)
    assert one(v, "tidegate_backend_num_requests_running") == 3
    assert one(v, "tidegate_backend_num_requests_waiting") == 2
    assert one(v, "tidegate_backend_kv_cache_usage_perc") == 0.25
    assert one(v, "tidegate_backend_prefix_cache_hits_total") == 32
    assert one(v, "tidegate_backend_num_preemptions_total") == 1
    assert one(v, "tidegate_backend_spec_decode_num_draft_tokens_total") == 40
    assert one(v, "tidegate_backend_spec_decode_num_accepted_tokens_total") == 25
    assert one(v, "tidegate_backend_spec_decode_num_emitted_tokens_total") == 35


def test_each_app_has_its_own_registry() -> None:
    first, second = BackendMetrics("m", lambda: None), BackendMetrics("m", lambda: None)
    first.request_finished(1, 1, "stop", None)
    assert ("tidegate_backend_prompt_tokens_total", (("model_name", "m"),)) not in samples(second)
