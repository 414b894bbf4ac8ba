"""A short run against a real `tidegate backend` serving SmolLM2: the counts come out exact."""

from __future__ import annotations

import asyncio

import pytest

from bench.client import Target
from bench.loadgen import LoadGenerator, LoadProfile
from bench.tokenizer import PromptTokenizer
from bench.workloads import Workload, WorkloadSpec
from tests.backend.backend_process import BackendProcess


@pytest.fixture
def backend_url(shared_backend: BackendProcess) -> str:
    return shared_backend.url


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_short_run_reports_exact_token_counts(backend_url: str, tokenizer: PromptTokenizer, endpoint: str) -> None:
    workload = Workload(WorkloadSpec(input_len=32, output_len=8), tokenizer, seed=11)
    target = Target(backend_url, "smollm2", endpoint=endpoint, timeout=120)
    result = asyncio.run(LoadGenerator(target, workload, LoadProfile(concurrency=2, num_requests=3)).run())
    s = result.summary()
    assert (s["completed"], s["failed"]) == (3, 0), s["errors"]
    assert s["usage_reported"]
    assert s["total_output_tokens"] == 3 * 8  # ignore_eos makes every output exactly max_tokens
    assert all(r.output_tokens == 8 and len(r.chunk_times) >= 1 for r in result.records)
    if endpoint == "/v1/completions":
        assert s["total_input_tokens"] == 3 * 32  # the server counts the prompt as the bench built it
    else:  # the chat template wraps the same 32 tokens
        assert all(r.input_tokens > 32 for r in result.records)
    assert s["mean_ttft_ms"] > 0 and s["mean_tpot_ms"] > 0
