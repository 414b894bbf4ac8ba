"""The load generator against a scripted server: every metric as scripted, faults counted, pacing honest."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import pytest

from bench.client import Target
from bench.loadgen import LoadGenerator, LoadProfile, ProfileError, RunResult, arrival_times
from bench.scripted_server import Script
from bench.tokenizer import PromptTokenizer
from bench.workloads import Workload, WorkloadSpec
from tests.servers import free_port

Mock = Callable[[Script], AbstractContextManager[str]]


def run(url: str, tokenizer: PromptTokenizer, profile: LoadProfile, endpoint: str = "/v1/completions",
        timeout: float = 10.0, **workload: Any) -> RunResult:
    spec = WorkloadSpec(**({"input_len": 64, "output_len": 16} | workload))
    target = Target(url, "mock", endpoint=endpoint, timeout=timeout)
    return asyncio.run(LoadGenerator(target, Workload(spec, tokenizer, seed=1), profile).run())


def test_scripted_ttft_and_token_gap_come_out_as_every_metric(mock: Mock, tokenizer: PromptTokenizer) -> None:
    script = Script(ttft=0.1, gap=0.02)
    with mock(script) as url:
        result = run(url, tokenizer, LoadProfile(concurrency=4, num_requests=12))
    s = result.summary()
    assert (s["completed"], s["failed"], s["errors"]) == (12, 0, {})
    assert s["total_input_tokens"] == 12 * 64  # the server counted the prompt with the same tokenizer
    assert s["total_output_tokens"] == 12 * 16
    assert s["usage_reported"]
    assert 100 <= s["median_ttft_ms"] <= 135
    assert 19 <= s["median_tpot_ms"] <= 23
    assert 15 <= s["median_itl_ms"] <= 25
    assert 400 <= s["median_e2el_ms"] <= 445  # TTFT + 15 gaps
    assert s["request_throughput"] == pytest.approx(12 / s["duration"])
    assert s["output_throughput"] == pytest.approx(12 * 16 / s["duration"])
    body = script.bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["max_tokens"] == 16 and body["model"] == "mock"


def test_chat_role_chunk_is_not_taken_as_the_first_token(mock: Mock, tokenizer: PromptTokenizer) -> None:
    script = Script(ttft=0.15, gap=0.01)
    with mock(script) as url:
        s = run(url, tokenizer, LoadProfile(concurrency=2, num_requests=4), "/v1/chat/completions").summary()
    assert s["completed"] == 4
    assert s["median_ttft_ms"] >= 150
    assert script.bodies[0]["max_completion_tokens"] == 16
    assert script.bodies[0]["messages"][0]["role"] == "user"


def test_errors_and_timeouts_are_counted_by_kind_never_dropped(mock: Mock, tokenizer: PromptTokenizer) -> None:
    script = Script(ttft=0.05, gap=0.01, fail={2: 500, 3: 429}, stall={4}, break_stream={5}, truncate={6})
    with mock(script) as url:
        result = run(url, tokenizer, LoadProfile(concurrency=4, num_requests=9), timeout=1.0)
    s = result.summary()
    assert s["num_prompts"] == 9
    assert s["errors"] == {"429": 1, "500": 1, "stream_error": 1, "timeout": 1, "truncated": 1}
    assert (s["completed"], s["failed"]) == (4, 5)
    by_error = {r.error: r for r in result.records if r.error}
    assert by_error["500"].status == 500 and "scripted" in by_error["500"].error_detail
    assert by_error["timeout"].status == 200  # headers came, tokens never did
    assert "engine died" in by_error["stream_error"].error_detail


def test_unreachable_server_counts_connect_errors(tokenizer: PromptTokenizer) -> None:
    s = run(f"http://127.0.0.1:{free_port()}", tokenizer, LoadProfile(concurrency=2, num_requests=3)).summary()
    assert (s["completed"], s["failed"], s["errors"]) == (0, 3, {"connect_error": 3})


def test_server_without_usage_falls_back_to_counting_chunks(mock: Mock, tokenizer: PromptTokenizer) -> None:
    with mock(Script(ttft=0.01, gap=0.005, no_usage=True)) as url:
        s = run(url, tokenizer, LoadProfile(concurrency=1, num_requests=2), output_len=7).summary()
    assert s["total_output_tokens"] == 14
    assert s["total_input_tokens"] == 2 * 64  # the local count stands in for usage.prompt_tokens
    assert not s["usage_reported"]


def test_rate_mode_reports_achieved_against_offered_rate(mock: Mock, tokenizer: PromptTokenizer) -> None:
    with mock(Script(ttft=0.03, gap=0.005)) as url:
        s = run(url, tokenizer, LoadProfile(rate=25.0, num_requests=40, seed=3), output_len=4).summary()
    assert s["completed"] == 40
    assert s["requested_rate"] == 25.0
    assert s["achieved_rate"] == pytest.approx(s["offered_rate"], rel=0.1)
    assert s["generator_kept_up"]


def test_generator_that_falls_behind_says_so_and_charges_the_wait(mock: Mock, tokenizer: PromptTokenizer) -> None:
    # one pooled connection cannot carry 50 req/s of 0.1 s requests: sends fall behind the schedule
    with mock(Script(ttft=0.1, gap=0.005)) as url:
        profile = LoadProfile(rate=50.0, num_requests=12, max_connections=1)
        s = run(url, tokenizer, profile, output_len=3).summary()
    assert s["completed"] == 12
    assert not s["generator_kept_up"]
    assert s["achieved_rate"] < 0.5 * s["offered_rate"]
    # no coordinated omission: the wait for the connection is inside TTFT and reported as queueing
    assert s["p99_client_queue_ms"] > 500
    assert s["p99_ttft_ms"] > s["p99_client_queue_ms"]
    assert s["client_bound"]  # the figures describe the client's pool, and the summary says so


def test_duration_bounds_when_requests_are_sent(mock: Mock, tokenizer: PromptTokenizer) -> None:
    with mock(Script(ttft=0.05, gap=0.01)) as url:
        result = run(url, tokenizer, LoadProfile(concurrency=2, duration=0.6), output_len=5)
    assert len(result.records) >= 4
    assert all(r.scheduled < 0.6 for r in result.records)
    assert all(r.ok for r in result.records)


def test_warmup_requests_are_sent_but_not_measured(mock: Mock, tokenizer: PromptTokenizer) -> None:
    script = Script(ttft=0.01, gap=0.005)
    with mock(script) as url:
        result = run(url, tokenizer, LoadProfile(concurrency=2, num_requests=5, warmup=3), output_len=2)
    assert len(script.bodies) == 8
    assert len(result.records) == 5


def test_multi_turn_sends_history_with_the_real_replies(mock: Mock, tokenizer: PromptTokenizer) -> None:
    script = Script(ttft=0.01, gap=0.005)
    with mock(script) as url:
        result = run(url, tokenizer, LoadProfile(concurrency=2, num_requests=6), "/v1/chat/completions",
                     output_len=3, turns=3)
    assert sorted(r.turn for r in result.records) == [0, 0, 1, 1, 2, 2]
    third_turns = [b for b in script.bodies if len(b["messages"]) == 5]
    assert len(third_turns) == 2
    assert [m["role"] for m in third_turns[0]["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert third_turns[0]["messages"][1]["content"] == " t0 t1 t2"
    # a later turn is scheduled when the turn before it ended
    for r in result.records:
        if r.turn:
            before = next(p for p in result.records if p.turn == r.turn - 1 and p.end == r.scheduled)
            assert before.ok


def test_arrival_gaps_have_the_requested_mean_and_burstiness() -> None:
    def gaps(burstiness: float) -> np.ndarray:
        times = list(arrival_times(10.0, burstiness, seed=7, duration=400.0))
        return np.diff(times)

    poisson, bursty = gaps(1.0), gaps(0.25)
    assert poisson.mean() == pytest.approx(0.1, rel=0.05)
    assert bursty.mean() == pytest.approx(0.1, rel=0.1)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.1)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.15)  # CV^2 = 1 / shape


@pytest.mark.parametrize("kwargs", [
    {}, {"concurrency": 1, "rate": 1.0, "num_requests": 1}, {"concurrency": 0, "num_requests": 1},
    {"rate": -1.0, "num_requests": 1}, {"concurrency": 1}, {"concurrency": 1, "num_requests": 1, "duration": 1.0},
    {"concurrency": 1, "duration": 0.0}, {"rate": 1.0, "num_requests": 1, "burstiness": 0.0},
    {"rate": float("inf"), "num_requests": 1},
])
def test_profiles_that_describe_no_run_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ProfileError):
        LoadProfile(**kwargs)


def test_duration_runs_to_the_end_of_the_last_request_even_a_failed_one(mock: Mock, tokenizer: PromptTokenizer) -> None:
    # the last request stalls until its deadline: throughput must count that time, not stop at the last success
    with mock(Script(ttft=0.01, gap=0.002, stall={3})) as url:
        result = run(url, tokenizer, LoadProfile(concurrency=1, num_requests=3), timeout=1.0)
    last = result.records[-1]
    assert not last.ok and last.end is not None
    s = result.summary()
    assert s["duration"] >= last.end >= 1.0 and s["completed"] == 2
    assert s["request_throughput"] == pytest.approx(2 / s["duration"])
