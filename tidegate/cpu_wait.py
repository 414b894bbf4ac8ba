"""How torch's OpenMP workers wait between the parallel ops of a decode step, chosen once per backend process.

libgomp reads its wait policy when torch loads it, so this runs before torch is imported. A decode step is a
few hundred short parallel ops; a worker that sleeps at once must be woken for each (tens of microseconds),
while one that polls holds a core. On cores given to the replica polling wins (docs/engine.md, Performance);
on a machine shared with other busy processes a polling worker takes a core that they, the step thread or the
event loop need, and steps get several times slower. `auto` looks at the machine when the backend starts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, MutableMapping

# Polls before a waiting worker sleeps: about 20-60 microseconds on current x86 cores, enough to catch the next
# op of a step, short enough that workers sleep between steps. libgomp's own default is 300,000.
SPIN_COUNT = "20000"
VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def idle_cpus(interval: float = 0.25) -> float | None:
    """How many of the machine's CPUs were idle over `interval` seconds (from /proc/stat); None where unknown."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields[:8])  # idle + iowait; user..steal

    try:
        idle0, total0 = sample()
        time.sleep(interval)
        idle1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (idle1 - idle0) / (total1 - total0) * (os.cpu_count() or 1)


def choose(wait: str, threads: int | None, idle: Callable[[], float | None] = idle_cpus) -> str:
    """The policy `auto` stands for: spin when every one of the replica's threads finds an idle CPU at start
    (the CPUs this process may use, as the machine's load shows them), else passive."""
    if wait != "auto":
        return wait
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    wanted = threads or usable  # torch's default: a thread per usable CPU
    if wanted <= 1:
        return "passive"  # no worker to wake
    free = idle()
    return "spin" if free is not None and min(free, usable) >= wanted - 0.25 else "passive"


def apply(wait: str, threads: int | None, environ: MutableMapping[str, str] = os.environ) -> str:
    """Set libgomp's variables for `wait` (before torch loads) and return the policy in force. Under `auto`,
    variables already in the environment are the operator's choice and stay."""
    if wait == "auto" and any(name in environ for name in VARIABLES):
        return "environment"
    policy = choose(wait, threads)
    for name in VARIABLES:
        environ.pop(name, None)
    if policy == "spin":
        environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    else:
        environ["OMP_WAIT_POLICY"] = policy.upper()
    return policy
