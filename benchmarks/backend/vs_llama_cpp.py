"""`tidegate backend` against llama.cpp's `llama-server` on the same GGUF file, through `tidegate bench`.

    python -m benchmarks.backend.vs_llama_cpp [--llama-server PATH] [--model smollm2] [--threads 2]
        [--concurrency 1,8,32] [--backend-args "--quantization none"] [--workloads random,realistic] [--json out.json]
        [--shapes qwen2.5-0.5b,llama3.2-1b [--llama-quantize PATH]] [--speculative off,on]

Without --llama-server only tidegate runs (for a before/after of tidegate alone). With --shapes, each named real
shape (benchmarks/backend/real_shapes.py: random weights in Qwen2.5-0.5B's or Llama-3.2-1B's real config) is served in
turn instead of --model, as a Q4_K_M file: llama.cpp's own quantizer makes it when --llama-quantize is given (the
same file serves both servers), else the converter's Q4_K_M recipe. --speculative runs tidegate once per setting
(`off` is `--speculative none`, `on` the default n-gram prompt lookup); llama.cpp runs once, without speculation
unless --llama-spec-type names one of its kinds (`ngram-simple` is its prompt lookup).
Each server's resident memory (RSS of its process tree) is read once it is ready and sampled through its runs.

Each server runs alone, one after the other, with the same threads and the same KV capacity (llama-server with 32
slots and a context of 512 tokens per slot, tidegate with a pool of 16,384 tokens, so that resident memory compares
at equal capacity; `--backend-args "--kv-cache-tokens N"` overrides it) and no queue timeout in either (llama-server
has none; tidegate's is set to an hour); each gets closed-loop runs at each concurrency of each workload,
`max(8, 2 x concurrency)` requests after one warm-up request, each level with prompts of its own (the bench's seed
is the level's index, so no level finds the one before's in a prefix cache): `random` is 256 prompt tokens and
128 output tokens (`ignore_eos`), and `realistic` is the bench's shipped chat turns, questions
and passages answered until EOS (at most 128 tokens), so that speculation is credited only for what it does on
real answers. Every row gives the run's failed requests beside its throughput. llama.cpp is the baseline, not a
dependency: `llama-server` builds from the llama.cpp that `llama-cpp-python`'s source distribution vendors
(`pip download --no-deps --no-binary :all: llama-cpp-python`, unpack, then in vendor/llama.cpp
`cmake -B build -DLLAMA_CURL=OFF -DGGML_NATIVE=ON && cmake --build build --target llama-server llama-quantize`).
Never run in CI.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from backend.loading.model_cache import resolve
from benchmarks.backend.real_shapes import CACHE, SHAPES, q4_k_m_file
from benchmarks.gateway.vs_litellm import Stack, free_port
from tidegate.stack.processes import wait_for_health

SLOTS = 32
SLOT_TOKENS = 512  # llama.cpp's context per slot; tidegate's KV pool holds as many tokens in all (--kv-cache-tokens)
# llama-server never refuses a queued request: tidegate's queue timeout (30 s by default, a 503 to fail over on)
# is set past any run, so that on a slow machine both serve every request and the run compares the same work
QUEUE_TIMEOUT_S = 3600
# the bench's per-request deadline (300 s by default) would cut the slower server's requests at 32 streams on a slow
# machine and count them as failures: a request's whole time is measured, however long, up to this bound
REQUEST_TIMEOUT_S = 1800
INPUT_LEN, OUTPUT_LEN = 256, 128


def start_tidegate(stack: Stack, model: Path, threads: int, extra: list[str]) -> tuple[str, int]:
    port = free_port()
    proc = stack.spawn([sys.executable, "-m", "tidegate.cli", "backend", "--model", str(model), "--port", str(port),
                        "--served-model-name", "bench", "--threads", str(threads), "--log-level", "warning",
                        "--kv-cache-tokens", str(SLOTS * SLOT_TOKENS), "--queue-timeout", str(QUEUE_TIMEOUT_S),
                        *extra])
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url + "/health", 300, proc)
    return url, proc.pid


def start_llama_server(stack: Stack, binary: str, model: Path, threads: int, spec_type: str = "none") -> tuple[str, int]:
    port = free_port()
    spec = ["--spec-type", spec_type] if spec_type != "none" else []
    proc = stack.spawn([binary, "-m", str(model), "--port", str(port), "--host", "127.0.0.1", "--alias", "bench",
                        "--threads", str(threads), "--threads-batch", str(threads), "--parallel", str(SLOTS),
                        "--ctx-size", str(SLOTS * SLOT_TOKENS), *spec])
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url + "/health", 300, proc)
    return url, proc.pid


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and its descendants (Linux /proc), 0 once it is gone."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, StopIteration):
            continue
    return total


class PeakRss:
    """Samples a process tree's RSS in a thread until stopped: its value once ready, and its peak."""

    def __init__(self, pid: int, every: float = 0.25) -> None:
        self.pid, self.every = pid, every
        self.ready = self.peak = tree_rss(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, tree_rss(self.pid))

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {"ready_rss_mib": self.ready / 2**20, "peak_rss_mib": self.peak / 2**20}


WORKLOADS = ("random", "grounded", "realistic")
# results[server][workload][concurrency] is one `tidegate bench` JSON summary
Results = dict[str, dict[str, dict[int, dict[str, Any]]]]


def bench_command(url: str, concurrency: int, workload: str, out: Path, seed: int = 0,
                  num_requests: int | None = None) -> list[str]:
    """The `tidegate bench` run for one server, workload and concurrency, writing its summary to `out`."""
    return [sys.executable, "-m", "tidegate.cli", "bench", "--base-url", url, "--model", "bench",
            "--concurrency", str(concurrency), "--num-requests", str(num_requests or max(8, 2 * concurrency)),
            "--warmup", "1", "--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN),
            "--workload", workload, "--seed", str(seed), "--timeout", str(REQUEST_TIMEOUT_S), "--no-progress",
            "--json", str(out)]


def bench(url: str, concurrency: int, workdir: Path, label: str, workload: str = "random",
          seed: int = 0, num_requests: int | None = None) -> dict[str, Any]:
    out = workdir / f"{label}-{workload}-c{concurrency}.json"
    proc = subprocess.run(bench_command(url, concurrency, workload, out, seed, num_requests), check=False,
                          stdout=subprocess.DEVNULL)
    if proc.returncode not in (0, 1):  # 1 (every request failed) still wrote the JSON, whose failures count
        raise SystemExit(f"tidegate bench exited {proc.returncode} for {label} {workload} c={concurrency}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _cells(run: dict[str, Any] | None) -> list[str]:
    if run is None:
        return ["-"] * 5
    return [f"{run['output_throughput']:.1f}", str(run["failed"]), f"{run.get('mean_output_len', 0):.0f}",
            f"{run['p95_ttft_ms'] / 1000:.2f} s", f"{run['median_tpot_ms']:.0f} ms"]


def table(results: Results, ours: str = "tidegate", theirs: str = "llama.cpp") -> str:
    """One row per workload and concurrency: each server's throughput with its failures beside it."""
    mine, other = results[ours], results.get(theirs, {})
    names = ("out tok/s", "failed", "mean out len", "P95 TTFT", "median TPOT")
    header = ["workload", "concurrency", *(f"{ours} {n}" for n in names), *(f"{theirs} {n}" for n in names),
              "ratio"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for workload, runs in mine.items():
        for c in sorted(runs):
            a, b = runs[c], other.get(workload, {}).get(c)
            ratio = f"{a['output_throughput'] / b['output_throughput']:.2f}x" \
                if b is not None and b["output_throughput"] else "-"
            lines.append("| " + " | ".join([workload, str(c), *_cells(a), *_cells(b), ratio]) + " |")
    return "\n".join(lines)


def memory_table(memory: dict[str, dict[str, float]]) -> str:
    """Each server's resident memory once ready and at its peak over the runs, with the ratio to llama.cpp's."""
    base = memory.get("llama.cpp")
    lines = ["| server | RSS ready | peak RSS | peak / llama.cpp's |", "| --- | --- | --- | --- |"]
    for label, m in memory.items():
        ratio = f"{m['peak_rss_mib'] / base['peak_rss_mib']:.2f}x" if base else "-"
        lines.append(f"| {label} | {m['ready_rss_mib']:.0f} MiB | {m['peak_rss_mib']:.0f} MiB | {ratio} |")
    return "\n".join(lines)


def failed_runs(results: Results) -> list[str]:
    """`server workload c=N: K failed` for every run that lost requests."""
    return [f"{label} {workload} c={c}: {run['failed']} failed {run.get('errors', {})}"
            for label, by_workload in results.items() for workload, runs in by_workload.items()
            for c, run in sorted(runs.items()) if run["failed"]]


def workload_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names or any(name not in WORKLOADS for name in names):
        raise argparse.ArgumentTypeError(f"--workloads takes a comma-separated subset of {', '.join(WORKLOADS)}")
    return list(dict.fromkeys(names))


def speculation_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names or any(name not in ("off", "on") for name in names):
        raise argparse.ArgumentTypeError("--speculative takes off, on or off,on")
    return list(dict.fromkeys(names))


def shape_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names or any(name not in SHAPES for name in names):
        raise argparse.ArgumentTypeError(f"--shapes takes a comma-separated subset of {', '.join(SHAPES)}")
    return names


def serve_and_bench(label: str, start: Callable[[Stack], tuple[str, int]], levels: list[int], workloads: list[str],
                    workdir: Path, results: Results, memory: dict[str, dict[str, float]],
                    num_requests: int | None = None) -> None:
    """Start one server, run every concurrency of every workload against it, record its runs and its RSS."""
    stack = Stack(workdir)
    try:
        url, pid = start(stack)
        rss = PeakRss(pid)
        try:
            results[label] = {workload: {} for workload in workloads}
            # each level draws its own prompts (seed = its index, as `tidegate bench` does in a sweep): with the
            # same seed, a level's first prompts were the level before's, and a prefix cache skipped their prefill
            for index, c in enumerate(levels):
                for workload in workloads:
                    run = results[label][workload][c] = bench(url, c, workdir, label.replace(" ", "-"), workload,
                                                              seed=index, num_requests=num_requests)
                    print(f"{label} {workload} c={c}: {run['output_throughput']:.1f} out tok/s, "
                          f"{run['failed']} failed", flush=True)
        finally:
            memory[label] = rss.stop()
    finally:
        stack.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-server", help="path of the llama-server binary (default: tidegate alone)")
    parser.add_argument("--model", default="smollm2", help="a .gguf file or a named model (unless --shapes)")
    parser.add_argument("--shapes", type=shape_list, help=f"real shapes to serve instead: {', '.join(SHAPES)}")
    parser.add_argument("--shape-cache", type=Path, default=CACHE, help="where the real-shape files are kept")
    parser.add_argument("--llama-quantize", help="llama.cpp's llama-quantize, to make the shapes' Q4_K_M files")
    parser.add_argument("--speculative", type=speculation_list, default=["on"],
                        help="tidegate's speculation: off (--speculative none), on (its default ngram), or off,on")
    parser.add_argument("--llama-spec-type", default="none",
                        help="llama-server's --spec-type (ngram-simple is its prompt lookup; default none)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--num-requests", type=int, help="requests per run (default max(8, 2 x concurrency))")
    parser.add_argument("--backend-args", default="", help="more flags for tidegate backend, e.g. --quantization none")
    parser.add_argument("--workloads", "--workload", type=workload_list, default=["random", "realistic"],
                        help="tidegate bench's workloads, run in turn at each concurrency (default random,realistic; "
                             "side-by-side claims give both; --workload is the same flag)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    models = {name: q4_k_m_file(name, args.shape_cache, args.llama_quantize) for name in args.shapes or []}
    models = models or {args.model: resolve(args.model)}
    levels = [int(c) for c in args.concurrency.split(",")]
    report: dict[str, Any] = {}
    for name, model in models.items():
        print(f"== {name}: {model}", flush=True)
        results: Results = {}
        memory: dict[str, dict[str, float]] = {}
        with tempfile.TemporaryDirectory(prefix="tidegate-vs-llama-") as tmp:
            for spec in args.speculative:
                label = "tidegate" if args.speculative == ["on"] else f"tidegate spec {spec}"
                extra = [*shlex.split(args.backend_args), *(["--speculative", "none"] if spec == "off" else [])]
                serve_and_bench(label, partial(start_tidegate, model=model, threads=args.threads, extra=extra),
                                levels, args.workloads, Path(tmp), results, memory, args.num_requests)
            if args.llama_server:
                serve_and_bench("llama.cpp", partial(start_llama_server, binary=args.llama_server, model=model,
                                                     threads=args.threads, spec_type=args.llama_spec_type),
                                levels, args.workloads, Path(tmp), results, memory, args.num_requests)
        for label in results:
            if label != "llama.cpp":
                print(table(results, label))
        print(memory_table(memory))
        lost = failed_runs(results)
        print("\n".join(["failed requests:", *lost]) if lost else "failed requests: none in any run")
        report[name] = {"model": str(model), "results": results, "memory": memory}
    if args.json:
        args.json.write_text(json.dumps(report if args.shapes else report[args.model]["results"], indent=2))


if __name__ == "__main__":
    main()
