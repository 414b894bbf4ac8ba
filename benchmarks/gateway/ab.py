"""Gateway CPU per request, A/B: the gateway of two git trees in front of one instant upstream, rounds interleaved.

On a shared machine the wall clock says little, so each round reads the CPU seconds the gateway's process tree
spent (user + system, from /proc) over a wrk run and divides by the requests it answered. Both gateways run
side by side on one Redis (a database each) and take turns, A B then B A, so that a slow spell of the machine
weighs on both; the figure to read is the ratio B / A of each round, and its median.

    git worktree add --detach /tmp/base main
    python -m benchmarks.gateway.ab --base /tmp/base --head . --rounds 4 --duration 6 --workers 1,2

Run it from the head tree's root. Each tree runs with its own packages (its gateway starts in that tree).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.gateway.vs_litellm import (
    Figure,
    Stack,
    cpu_seconds,
    start_tidegate,
    start_upstream_and_redis,
    wrk,
)

CONCURRENCY = 32


@dataclass(slots=True)
class Round:
    tree: str  # base or head
    workers: int
    mode: str  # whole or stream
    round: int
    requests_per_s: float
    cpu_ms_per_request: float
    non_2xx: int
    errors: int
    load: float  # the one-minute load average when the run ended


def measured(url: str, key: str, stream: bool, duration: int, workdir: Path, pid: int) -> Figure:
    before = cpu_seconds(pid)
    figure = wrk(url, key, stream, CONCURRENCY, duration, workdir)
    used = cpu_seconds(pid) - before
    figure.cpu_ms_per_request = 1000 * used / max(1.0, figure.requests_per_s * duration)
    return figure


def run(base: Path, head: Path, workers: list[int], rounds: int, duration: int) -> list[Round]:
    results: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="tidegate-ab-") as tmp:
        workdir = Path(tmp)
        stack = Stack(workdir)
        try:
            upstream, redis, _ = start_upstream_and_redis(stack)
            for count in workers:
                gateways = {}
                for db, (name, tree) in enumerate((("base", base), ("head", head))):
                    url, key, proc = start_tidegate(stack, upstream + "/v1", f"{redis}/{db}", count, tree)
                    gateways[name] = (url, key, proc)
                    for stream in (False, True):  # warm-up: connections, caches, lazy imports
                        wrk(url, key, stream, 8, 2, workdir)
                for number in range(rounds):
                    order = ("base", "head") if number % 2 == 0 else ("head", "base")
                    for stream in (False, True):
                        for name in order:
                            url, key, proc = gateways[name]
                            figure = measured(url, key, stream, duration, workdir, proc.pid)
                            result = Round(name, count, figure.mode, number, round(figure.requests_per_s, 1),
                                           round(figure.cpu_ms_per_request, 3), figure.non_2xx, figure.errors,
                                           os.getloadavg()[0])
                            results.append(result)
                            print(f"w={count} round {number} {name:>4} {result.mode:>6} "
                                  f"{result.requests_per_s:8.1f} req/s cpu/req {result.cpu_ms_per_request:6.3f} ms "
                                  f"non-2xx {result.non_2xx} errors {result.errors} load {result.load:.2f}",
                                  flush=True)
                for _, _, proc in gateways.values():
                    stack.stop(proc)
        finally:
            stack.close()
    return results


def summary(results: list[Round]) -> list[str]:
    """One line per workers and mode: the median CPU per request of each tree and the median of the round ratios."""
    lines = []
    for count in sorted({r.workers for r in results}):
        for mode in ("whole", "stream"):
            rows = [r for r in results if r.workers == count and r.mode == mode]
            base = {r.round: r for r in rows if r.tree == "base"}
            head = {r.round: r for r in rows if r.tree == "head"}
            ratios = [head[n].cpu_ms_per_request / base[n].cpu_ms_per_request for n in base if n in head]
            loads = [r.load for r in rows]
            lines.append(
                f"w={count} {mode:>6}: base {statistics.median(r.cpu_ms_per_request for r in base.values()):.3f} ms "
                f"({statistics.median(r.requests_per_s for r in base.values()):.0f} req/s), "
                f"head {statistics.median(r.cpu_ms_per_request for r in head.values()):.3f} ms "
                f"({statistics.median(r.requests_per_s for r in head.values()):.0f} req/s), "
                f"head/base {statistics.median(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f}), "
                f"load {min(loads):.1f}-{max(loads):.1f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True, help="the baseline tree (a git worktree)")
    parser.add_argument("--head", type=Path, default=Path("."), help="the tree under test")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=int, default=6, help="seconds per wrk run")
    parser.add_argument("--workers", default="1", help="comma-separated worker counts")
    parser.add_argument("--json", type=Path, help="write every round here")
    args = parser.parse_args()
    if shutil.which("wrk") is None or shutil.which("redis-server") is None:
        sys.exit("benchmarks.gateway.ab needs wrk and redis-server on PATH")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results = run(args.base.resolve(), args.head.resolve(), [int(w) for w in args.workers.split(",")], args.rounds,
                  args.duration)
    print(f"started {started}, c={CONCURRENCY}, {args.rounds} rounds of {args.duration} s")
    print("\n".join(summary(results)))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
