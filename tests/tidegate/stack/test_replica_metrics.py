"""Reading a replica's load from its /metrics text: the queue gauges, and the P95 TTFT of the requests that
finished between two reads."""

from __future__ import annotations

import math

import pytest

from backend.engine.records import EngineStats, RequestTimings
from backend.server.metrics import BackendMetrics
from tidegate.stack.replica_metrics import bucket_increase, histogram_quantile, parse_load

VLLM_TEXT = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 7.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{le="1.0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 2.5
"""


def test_a_tidegate_backends_metrics_give_its_queue_and_ttft_histogram() -> None:
    stats = EngineStats(num_running=2, num_waiting=5, kv_blocks_total=64, kv_blocks_free=10, kv_usage=0.8,
                        prefix_cache_queries=0, prefix_cache_hits=0, num_preemptions=0, steps=9)
    metrics = BackendMetrics("smollm2", lambda: stats)
    for ttft in (0.04, 0.4, 1.2):
        metrics.request_finished(8, 2, "length", RequestTimings(queued=0.0, scheduled=0.0, first_token=ttft))
    load = parse_load(metrics.render().decode())
    assert (load.waiting, load.running) == (5, 2)
    assert load.ttft_buckets[0.05] == 1 and load.ttft_buckets[0.5] == 2 and load.ttft_buckets[math.inf] == 3


def test_vllm_names_are_read_too() -> None:
    load = parse_load(VLLM_TEXT)
    assert (load.waiting, load.running) == (7, 3)
    assert load.ttft_buckets == {0.5: 1, 1.0: 4, math.inf: 4}


def test_a_replica_still_loading_has_no_load() -> None:
    load = parse_load(BackendMetrics("smollm2", lambda: None).render().decode())
    assert (load.waiting, load.running) == (0, 0)


@pytest.mark.parametrize(("buckets", "q", "expected"), [
    ({0.5: 1, 1.0: 4, math.inf: 4}, 0.95, 0.5 + 0.5 * (3.8 - 1) / 3),
    ({0.5: 0, 1.0: 0, math.inf: 0}, 0.95, None),
    ({}, 0.95, None),
    ({0.5: 0, 1.0: 0, math.inf: 2}, 0.95, 1.0),  # all beyond the last bound: that bound
    ({0.1: 10, 0.2: 10, math.inf: 10}, 0.5, 0.05),
])
def test_quantile_interpolates_within_its_bucket(buckets: dict[float, float], q: float,
                                                 expected: float | None) -> None:
    assert histogram_quantile(q, buckets) == pytest.approx(expected)


def test_the_increase_counts_only_new_requests_and_survives_a_restart() -> None:
    before = {0.5: 1.0, math.inf: 3.0}
    assert bucket_increase({0.5: 2.0, math.inf: 6.0}, before) == {0.5: 1.0, math.inf: 3.0}
    # the counters went back: the replica restarted and everything it has is new
    assert bucket_increase({0.5: 1.0, math.inf: 1.0}, before) == {0.5: 1.0, math.inf: 1.0}
