"""`tidegate backend` against llama.cpp's `llama-server` on the same GGUF file, through `tidegate bench`.

    python -m benchmarks.vs_llama_cpp [--llama-server PATH] [--model smollm2] [--threads 2]
        [--concurrency 1,8,32] [--backend-args "--quantization none"] [--workloads random,realistic] [--json out.json]

Without --llama-server only tidegate runs (for a before/after of tidegate alone).

Each server runs alone, one after the other, with the same threads (llama-server with 32 slots and a context of
512 tokens per slot); each gets closed-loop runs at each concurrency of each workload, `max(8, 2 x concurrency)`
requests after one warm-up request: `random` is 256 prompt tokens and 128 output tokens (`ignore_eos`), and
`realistic` is the bench's shipped chat turns, questions and passages answered until EOS (at most 128 tokens), so
that speculation is credited only for what it does on real answers. Every row gives the run's failed requests
beside its throughput. llama.cpp is the baseline, not
a dependency: `llama-server` builds from the llama.cpp that `llama-cpp-python`'s source distribution vendors
(`pip download --no-deps --no-binary :all: llama-cpp-python`, unpack, then in vendor/llama.cpp
`cmake -B build -DLLAMA_CURL=OFF -DGGML_NATIVE=ON && cmake --build build --target llama-server`). Never run in CI.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from backend.loading.model_cache import resolve
from benchmarks.gateway import Stack, free_port
from tidegate.stack.processes import wait_for_health

SLOTS = 32
INPUT_LEN, OUTPUT_LEN = 256, 128


def start_tidegate(stack: Stack, model: Path, threads: int, extra: list[str]) -> str:
    port = free_port()
    proc = stack.spawn([sys.executable, "-m", "tidegate.cli", "backend", "--model", str(model), "--port", str(port),
                        "--served-model-name", "bench", "--threads", str(threads), "--log-level", "warning", *extra])
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url + "/health", 300, proc)
    return url


def start_llama_server(stack: Stack, binary: str, model: Path, threads: int) -> str:
    port = free_port()
    proc = stack.spawn([binary, "-m", str(model), "--port", str(port), "--host", "127.0.0.1", "--alias", "bench",
                        "--threads", str(threads), "--threads-batch", str(threads), "--parallel", str(SLOTS),
                        "--ctx-size", str(SLOTS * 512)])
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url + "/health", 300, proc)
    return url


WORKLOADS = ("random", "grounded", "realistic")
# results[server][workload][concurrency] is one `tidegate bench` JSON summary
Results = dict[str, dict[str, dict[int, dict[str, Any]]]]


def bench_command(url: str, concurrency: int, workload: str, out: Path, seed: int = 0) -> list[str]:
    """The `tidegate bench` run for one server, workload and concurrency, writing its summary to `out`."""
    return [sys.executable, "-m", "tidegate.cli", "bench", "--base-url", url, "--model", "bench",
            "--concurrency", str(concurrency), "--num-requests", str(max(8, 2 * concurrency)),
            "--warmup", "1", "--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN),
            "--workload", workload, "--seed", str(seed), "--no-progress", "--json", str(out)]


def bench(url: str, concurrency: int, workdir: Path, label: str, workload: str = "random",
          seed: int = 0) -> dict[str, Any]:
    out = workdir / f"{label}-{workload}-c{concurrency}.json"
    proc = subprocess.run(bench_command(url, concurrency, workload, out, seed), check=False, stdout=subprocess.DEVNULL)
    if proc.returncode not in (0, 1):  # 1 (every request failed) still wrote the JSON, whose failures count
        raise SystemExit(f"tidegate bench exited {proc.returncode} for {label} {workload} c={concurrency}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _cells(run: dict[str, Any] | None) -> list[str]:
    if run is None:
        return ["-"] * 5
    return [f"{run['output_throughput']:.1f}", str(run["failed"]), f"{run.get('mean_output_len', 0):.0f}",
            f"{run['p95_ttft_ms'] / 1000:.2f} s", f"{run['median_tpot_ms']:.0f} ms"]


def table(results: Results) -> str:
    """One row per workload and concurrency: each server's throughput with its failures beside it."""
    ours, theirs = results["tidegate"], results.get("llama.cpp", {})
    names = ("out tok/s", "failed", "mean out len", "P95 TTFT", "median TPOT")
    header = ["workload", "concurrency", *(f"tidegate {n}" for n in names), *(f"llama.cpp {n}" for n in names),
              "ratio"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for workload, runs in ours.items():
        for c in sorted(runs):
            a, b = runs[c], theirs.get(workload, {}).get(c)
            ratio = f"{a['output_throughput'] / b['output_throughput']:.2f}x" \
                if b is not None and b["output_throughput"] else "-"
            lines.append("| " + " | ".join([workload, str(c), *_cells(a), *_cells(b), ratio]) + " |")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-server", help="path of the llama-server binary (default: tidegate alone)")
    parser.add_argument("--model", default="smollm2", help="a .gguf file or a named model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--backend-args", default="", help="more flags for tidegate backend, e.g. --quantization none")
    parser.add_argument("--workloads", "--workload", type=workload_list, default=["random", "realistic"],
                        help="tidegate bench's workloads, run in turn at each concurrency (default random,realistic; "
                             "side-by-side claims give both; --workload is the same flag)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    model = resolve(args.model)
    levels = [int(c) for c in args.concurrency.split(",")]
    results: Results = {}
    with tempfile.TemporaryDirectory(prefix="tidegate-vs-llama-") as tmp:
        workdir = Path(tmp)
        for label in ("tidegate", "llama.cpp") if args.llama_server else ("tidegate",):
            stack = Stack(workdir)
            try:
                if label == "tidegate":
                    url = start_tidegate(stack, model, args.threads, shlex.split(args.backend_args))
                else:
                    url = start_llama_server(stack, args.llama_server, model, args.threads)
                results[label] = {workload: {} for workload in args.workloads}
                for c in levels:
                    for workload in args.workloads:
                        run = results[label][workload][c] = bench(url, c, workdir, label, workload)
                        print(f"{label} {workload} c={c}: {run['output_throughput']:.1f} out tok/s, "
                              f"{run['failed']} failed", flush=True)
            finally:
                stack.close()
    print(table(results))
    lost = failed_runs(results)
    print("\n".join(["failed requests:", *lost]) if lost else "failed requests: none in any run")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
