"""Where one stream's time goes in `tidegate backend`: its output tokens/s and TPOT through `tidegate bench`, and
the CPU time each of the backend's threads spends per generated token.

    python -m benchmarks.backend.serving_loop [--threads 2] [--runs 3] [--backend-args "--speculative none"]

One backend, then `--runs` closed-loop runs at concurrency 1 (256 prompt tokens, 128 output tokens,
`ignore_eos`, 8 requests after one warm-up, each run with its own prompts). Around each run it reads every
thread's CPU time from /proc (Linux): the main thread is the server's event loop, the busiest other thread the
engine's step loop (the model's Python and its share of every product), the rest mostly OpenMP workers. CPU per
token is less noisy than tokens/s on a machine shared with other work; the prompt's prefill is part of it.
The client's own CPU is reported too, since on a small machine it competes for the same cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import shlex
import statistics
import tempfile
from pathlib import Path

from backend.loading.model_cache import resolve
from benchmarks.backend.vs_llama_cpp import OUTPUT_LEN, bench, start_tidegate
from benchmarks.gateway.vs_litellm import Stack


@dataclasses.dataclass(slots=True)
class Run:
    """One bench run's figures; CPU in milliseconds per output token."""

    output_throughput: float
    median_tpot_ms: float
    median_ttft_ms: float
    load: float  # 1-minute load average when it started
    event_loop: float
    engine: float
    other_threads: float
    client: float

    @property
    def backend(self) -> float:
        return self.event_loop + self.engine + self.other_threads


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of a process, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        seconds[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return seconds


def bench_run(url: str, workdir: Path, seed: int, pid: int) -> Run:
    """One run, with prompts of its own (the same prompts again would be served from the prefix cache)."""
    before, client_before = thread_cpu(pid), resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    result = bench(url, 1, workdir, f"run-{seed}", seed=seed)
    after, client_after = thread_cpu(pid), resource.getrusage(resource.RUSAGE_CHILDREN)
    per_token = 1000 / (result["total_output_tokens"] + OUTPUT_LEN)  # the warm-up request's tokens cost CPU too
    spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    event_loop = spent.pop(pid, 0.0)
    engine = max(spent.values(), default=0.0)
    client = (client_after.ru_utime + client_after.ru_stime) - (client_before.ru_utime + client_before.ru_stime)
    return Run(result["output_throughput"], result["median_tpot_ms"], result["median_ttft_ms"], load,
               event_loop * per_token, engine * per_token, (sum(spent.values()) - engine) * per_token,
               client * per_token)


def report(runs: list[Run]) -> str:
    """A table of the runs, and their medians (field by field) as its last row."""
    median = Run(*(statistics.median(getattr(r, f.name) for r in runs) for f in dataclasses.fields(Run)))
    lines = ["| run | load | out tok/s | median TPOT | median TTFT | backend CPU ms/token | event loop | engine thread "
             "| other threads | client |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, r in [*((str(i), r) for i, r in enumerate(runs, 1)), ("median", median)]:
        lines.append(f"| {label} | {r.load:.1f} | {r.output_throughput:.1f} | {r.median_tpot_ms:.1f} ms "
                     f"| {r.median_ttft_ms:.0f} ms | {r.backend:.1f} | {r.event_loop:.2f} | {r.engine:.1f} "
                     f"| {r.other_threads:.1f} | {r.client:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="a .gguf file or a named model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--backend-args", default="--speculative none",
                        help="more flags for tidegate backend (default: --speculative none)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tidegate-serving-loop-") as tmp:
        workdir = Path(tmp)
        stack = Stack(workdir)
        try:
            url, _ = start_tidegate(stack, resolve(args.model), args.threads, shlex.split(args.backend_args))
            pid = stack.procs[-1].pid
            runs = [bench_run(url, workdir, seed, pid) for seed in range(1, args.runs + 1)]
        finally:
            stack.close()
    print(report(runs))


if __name__ == "__main__":
    main()
