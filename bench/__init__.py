"""The load generator and capacity planner behind `tidegate bench`.

Scripts that build on it (offline, gateway and admission benchmarks) drive it like this::

    target = Target("http://127.0.0.1:9001", "smollm2")
    workload = Workload(WorkloadSpec(input_len=256, output_len=128), load_tokenizer())
    result = asyncio.run(LoadGenerator(target, workload, LoadProfile(concurrency=8, num_requests=64)).run())
    summary = result.summary(Slo.parse("ttft:500,tpot:50"))  # vLLM's keys: p99_ttft_ms, ...
"""

from __future__ import annotations

from bench.client import Target
from bench.loadgen import LoadGenerator, LoadProfile, RunResult
from bench.metrics import Slo, summarize
from bench.plan import CapacityPlan, plan_capacity
from bench.records import MeasuredRequest
from bench.report import format_summary, format_sweep, plot_sweep, read_summaries, write_csv, write_json
from bench.tokenizer import PromptTokenizer, load_tokenizer
from bench.workloads import RequestSpec, Workload, WorkloadSpec

__all__ = [
    "CapacityPlan",
    "LoadGenerator",
    "LoadProfile",
    "MeasuredRequest",
    "PromptTokenizer",
    "RequestSpec",
    "RunResult",
    "Slo",
    "Target",
    "Workload",
    "WorkloadSpec",
    "format_summary",
    "format_sweep",
    "load_tokenizer",
    "plan_capacity",
    "plot_sweep",
    "read_summaries",
    "summarize",
    "write_csv",
    "write_json",
]
