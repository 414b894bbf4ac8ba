"""vLLM's formulas on hand-built records: percentiles, TPOT, ITL, goodput, failures by status."""

from __future__ import annotations

import numpy as np
import pytest

from bench.metrics import Slo, SloError, distribution, summarize
from bench.records import MeasuredRequest


def record(index: int, ttft: float, gap: float, tokens: int, scheduled: float = 0.0,
           sent_after: float = 0.0, input_tokens: int = 10) -> MeasuredRequest:
    times = [scheduled + ttft + i * gap for i in range(tokens)]
    return MeasuredRequest(index=index, scheduled=scheduled, sent=scheduled + sent_after, chunk_times=times,
                         end=times[-1] + 0.001, output_tokens=tokens, input_tokens=input_tokens,
                         usage_reported=True, status=200)


def failed(index: int, error: str, status: int | None) -> MeasuredRequest:
    return MeasuredRequest(index=index, scheduled=0.0, status=status, error=error, end=0.01)


def test_percentiles_of_one_to_one_hundred_ms_follow_numpy_linear_interpolation() -> None:
    stats = distribution("ttft", [i / 1000 for i in range(1, 101)])
    assert stats["mean_ttft_ms"] == pytest.approx(50.5)
    assert stats["median_ttft_ms"] == pytest.approx(50.5)
    assert stats["p95_ttft_ms"] == pytest.approx(95.05)
    assert stats["p99_ttft_ms"] == pytest.approx(99.01)
    assert stats["std_ttft_ms"] == pytest.approx(28.866, abs=1e-3)


def test_percentiles_of_a_skewed_distribution_expose_the_tail_the_mean_hides() -> None:
    # 98 fast requests and 2 slow ones: the mean barely moves, P99 lands on the slow ones
    values = [0.010] * 98 + [1.0, 1.0]
    stats = distribution("e2el", values)
    assert stats["median_e2el_ms"] == pytest.approx(10.0)
    assert stats["p95_e2el_ms"] == pytest.approx(10.0)
    assert stats["p99_e2el_ms"] == pytest.approx(1000.0)
    assert stats["mean_e2el_ms"] == pytest.approx(29.8)


def test_empty_distribution_reports_zeros_like_vllm() -> None:
    assert set(distribution("itl", []).values()) == {0.0}


def test_tpot_excludes_the_first_token_and_itl_lists_every_gap() -> None:
    r = record(0, ttft=0.2, gap=0.05, tokens=5)
    assert r.ttft == pytest.approx(0.2)
    assert r.e2el == pytest.approx(0.4)
    assert r.tpot == pytest.approx(0.05)  # (0.4 - 0.2) / (5 - 1)
    assert r.itl == pytest.approx([0.05] * 4)


def test_tpot_uses_usage_tokens_when_chunks_carry_several_tokens() -> None:
    # 3 chunks carrying 9 tokens: TPOT divides by tokens, ITL stays per chunk
    r = record(0, ttft=0.1, gap=0.08, tokens=3)
    r.output_tokens = 9
    assert r.tpot == pytest.approx(0.16 / 8)
    assert r.itl == pytest.approx([0.08, 0.08])


def test_single_token_output_has_no_tpot() -> None:
    summary = summarize([record(0, ttft=0.1, gap=0.0, tokens=1)], duration=1.0)
    assert summary["completed"] == 1
    assert summary["mean_tpot_ms"] == 0.0


def test_clock_starts_at_scheduled_time_so_client_queueing_is_inside_ttft() -> None:
    r = record(0, ttft=0.3, gap=0.01, tokens=2, scheduled=1.0, sent_after=0.25)
    assert r.client_queue == pytest.approx(0.25)
    summary = summarize([r], duration=2.0)
    assert summary["mean_ttft_ms"] == pytest.approx(300.0)
    assert summary["mean_client_queue_ms"] == pytest.approx(250.0)


def test_failures_are_counted_by_status_and_kept_out_of_latency() -> None:
    records = [record(i, ttft=0.1, gap=0.01, tokens=4) for i in range(3)]
    records += [failed(3, "500", 500), failed(4, "429", 429), failed(5, "429", 429), failed(6, "timeout", None)]
    summary = summarize(records, duration=2.0)
    assert summary["completed"] == 3
    assert summary["failed"] == 4
    assert summary["errors"] == {"429": 2, "500": 1, "timeout": 1}
    assert summary["total_output_tokens"] == 12
    assert summary["total_input_tokens"] == 30
    assert summary["request_throughput"] == pytest.approx(1.5)
    assert summary["output_throughput"] == pytest.approx(6.0)
    assert summary["total_token_throughput"] == pytest.approx(21.0)
    assert summary["mean_ttft_ms"] == pytest.approx(100.0)


def test_goodput_counts_requests_meeting_every_slo_and_failures_lower_attainment() -> None:
    records = [
        record(0, ttft=0.1, gap=0.02, tokens=10),  # good
        record(1, ttft=0.6, gap=0.02, tokens=10),  # TTFT too slow
        record(2, ttft=0.1, gap=0.09, tokens=10),  # TPOT too slow
        record(3, ttft=0.2, gap=0.03, tokens=10),  # good
        failed(4, "503", 503),
    ]
    summary = summarize(records, duration=2.0, slo=Slo.parse("ttft:500,tpot:50"))
    assert summary["request_goodput"] == pytest.approx(1.0)  # 2 good in 2 s
    assert summary["slo_attainment"] == pytest.approx(0.4)
    assert summary["slo"] == "ttft:500,tpot:50"


def test_e2el_slo_is_applied() -> None:
    slo = Slo.parse("e2el:300")
    assert slo.met_by(record(0, ttft=0.1, gap=0.02, tokens=5))
    assert not slo.met_by(record(1, ttft=0.1, gap=0.1, tokens=5))


@pytest.mark.parametrize("text", ["", "ttft", "ttft:abc", "latency:5", "ttft:5,ttft:6", "tpot:-1", "ttft:0"])
def test_malformed_slo_is_rejected_with_a_reason(text: str) -> None:
    with pytest.raises(SloError):
        Slo.parse(text)


def test_output_length_figures_describe_only_completed_answers() -> None:
    records = [record(i, 0.1, 0.01, tokens) for i, tokens in enumerate((2, 4, 6, 40))] + [failed(9, "500", 500)]
    s = summarize(records, 2.0)
    assert s["mean_output_len"] == 13.0 and s["median_output_len"] == 5.0
    assert s["p95_output_len"] == pytest.approx(float(np.percentile([2, 4, 6, 40], 95)))
    assert (s["completed"], s["failed"], s["request_throughput"]) == (4, 1, 2.0)
