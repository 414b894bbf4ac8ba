"""`tidegate backend`'s resident memory, A/B: the backend of two git trees on one GGUF file, runs interleaved.

    git archive main | tar -x -C /tmp/base      # or: git worktree add --detach /tmp/base main
    python -m benchmarks.backend.memory --base /tmp/base --model FILE [--rounds 2] [--concurrency 8]

Run it from the head tree's root; each tree's backend starts in that tree, so its packages shadow the installed
ones. Each run reads the process tree's RSS once /health answers, then samples it through one closed-loop
`tidegate bench` burst (256 prompt and 128 output tokens per request), and reads the main process's VmHWM (the
high-water mark, load included) at the end. The burst's output throughput is printed beside, so that a memory
saving that costs speed shows it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.backend.vs_llama_cpp import PeakRss, bench
from benchmarks.gateway.vs_litellm import Stack, free_port
from tidegate.stack.processes import wait_for_health

MIB = 2**20


@dataclass(slots=True)
class MemoryRun:
    tree: str  # base or head
    ready_mib: float
    peak_mib: float
    hwm_mib: float
    out_tok_s: float


def vm_hwm(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) * 1024


def measure(name: str, tree: Path, model: Path, args: argparse.Namespace, workdir: Path) -> MemoryRun:
    stack = Stack(workdir)
    try:
        port = free_port()
        proc = stack.spawn([sys.executable, "-m", "tidegate.cli", "backend",
                            "--model", str(model), "--port", str(port), "--served-model-name", "bench",
                            "--threads", str(args.threads), "--log-level", "warning", *args.backend_args.split()],
                           cwd=tree)
        url = f"http://127.0.0.1:{port}"
        wait_for_health(url + "/health", 300, proc)
        rss = PeakRss(proc.pid)
        run = bench(url, args.concurrency, workdir, name, num_requests=args.num_requests)
        memory = rss.stop()
        return MemoryRun(name, memory["ready_rss_mib"], memory["peak_rss_mib"], vm_hwm(proc.pid) / MIB,
                         float(run["output_throughput"]))
    finally:
        stack.close()


def tree_arguments(description: str, model_help: str) -> argparse.ArgumentParser:
    """The arguments of an A/B of two trees on one model: --base, --head, --model, --rounds."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--base", type=Path, required=True, help="root of the baseline tree")
    parser.add_argument("--head", type=Path, default=Path.cwd(), help="root of the tree under test (default: here)")
    parser.add_argument("--model", type=Path, required=True, help=model_help)
    parser.add_argument("--rounds", type=int, default=2)
    return parser


def main() -> None:
    parser = tree_arguments(__doc__.split("\n")[0], "GGUF file both backends serve")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backend-args", default="", help="more `tidegate backend` arguments, for both trees")
    args = parser.parse_args()
    runs: list[MemoryRun] = []
    with tempfile.TemporaryDirectory(prefix="backend-memory-") as tmp:
        for round_ in range(args.rounds):
            for name, tree in (("base", args.base), ("head", args.head)):
                run = measure(name, tree.resolve(), args.model.resolve(), args, Path(tmp))
                runs.append(run)
                print(f"round {round_} {name}: ready {run.ready_mib:.0f} MiB, peak {run.peak_mib:.0f} MiB, "
                      f"VmHWM {run.hwm_mib:.0f} MiB, {run.out_tok_s:.1f} out tok/s", flush=True)
    print("| tree | RSS ready | peak RSS | VmHWM | out tok/s |\n| --- | --- | --- | --- | --- |")
    for name in ("base", "head"):
        mine = [r for r in runs if r.tree == name]
        print(f"| {name} | {statistics.median(r.ready_mib for r in mine):.0f} MiB "
              f"| {statistics.median(r.peak_mib for r in mine):.0f} MiB "
              f"| {statistics.median(r.hwm_mib for r in mine):.0f} MiB "
              f"| {statistics.median(r.out_tok_s for r in mine):.1f} |")


if __name__ == "__main__":
    main()
