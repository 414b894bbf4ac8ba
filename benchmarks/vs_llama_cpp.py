"""`tidegate backend` against llama.cpp's `llama-server` on the same GGUF file, through `tidegate bench`.

    python -m benchmarks.vs_llama_cpp [--llama-server PATH] [--model smollm2] [--threads 2]
        [--concurrency 1,8,32] [--backend-args "--quantization none"] [--workload random|grounded] [--json out.json]

Without --llama-server only tidegate runs (for a before/after of tidegate alone).

Each server runs alone, one after the other, with the same threads (llama-server with 32 slots and a context of
512 tokens per slot); each gets closed-loop runs of 256 prompt tokens and 128 output tokens (`ignore_eos`) at
each concurrency, `max(8, 2 x concurrency)` requests after one warm-up request. llama.cpp is the baseline, not
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


def bench(url: str, concurrency: int, workdir: Path, label: str, workload: str = "random",
          seed: int = 0) -> dict[str, Any]:
    out = workdir / f"{label}-c{concurrency}.json"
    subprocess.run([sys.executable, "-m", "tidegate.cli", "bench", "--base-url", url, "--model", "bench",
                    "--concurrency", str(concurrency), "--num-requests", str(max(8, 2 * concurrency)),
                    "--warmup", "1", "--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN),
                    "--workload", workload, "--seed", str(seed), "--no-progress", "--json", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def table(results: dict[str, dict[int, dict[str, Any]]]) -> str:
    ours, theirs = results["tidegate"], results.get("llama.cpp", {})
    lines = ["| concurrency | tidegate out tok/s | llama.cpp out tok/s | ratio | tidegate P95 TTFT | llama.cpp P95 TTFT "
             "| tidegate median TPOT | llama.cpp median TPOT |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in sorted(ours):
        a, b = ours[c], theirs.get(c)
        if b is None:
            lines.append(f"| {c} | {a['output_throughput']:.1f} | - | - | {a['p95_ttft_ms'] / 1000:.2f} s | - "
                         f"| {a['median_tpot_ms']:.0f} ms | - |")
            continue
        lines.append(
            f"| {c} | {a['output_throughput']:.1f} | {b['output_throughput']:.1f} "
            f"| {a['output_throughput'] / b['output_throughput']:.2f}x "
            f"| {a['p95_ttft_ms'] / 1000:.2f} s | {b['p95_ttft_ms'] / 1000:.2f} s "
            f"| {a['median_tpot_ms']:.0f} ms | {b['median_tpot_ms']:.0f} ms |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-server", help="path of the llama-server binary (default: tidegate alone)")
    parser.add_argument("--model", default="smollm2", help="a .gguf file or a named model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--backend-args", default="", help="more flags for tidegate backend, e.g. --quantization none")
    parser.add_argument("--workload", choices=["random", "grounded"], default="random",
                        help="tidegate bench's workload: random words, or grounded (edit or summarise a passage)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    model = resolve(args.model)
    levels = [int(c) for c in args.concurrency.split(",")]
    results: dict[str, dict[int, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="tidegate-vs-llama-") as tmp:
        workdir = Path(tmp)
        for label in ("tidegate", "llama.cpp") if args.llama_server else ("tidegate",):
            stack = Stack(workdir)
            try:
                if label == "tidegate":
                    url = start_tidegate(stack, model, args.threads, shlex.split(args.backend_args))
                else:
                    url = start_llama_server(stack, args.llama_server, model, args.threads)
                results[label] = {}
                for c in levels:
                    results[label][c] = bench(url, c, workdir, label, args.workload)
                    print(f"{label} c={c}: {results[label][c]['output_throughput']:.1f} out tok/s", flush=True)
            finally:
                stack.close()
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
