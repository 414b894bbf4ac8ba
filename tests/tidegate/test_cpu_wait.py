"""tidegate/cpu_wait.py: which wait policy libgomp gets, and that it takes effect in a fresh torch process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tidegate import cpu_wait

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("idle, threads, expected", [
    (2.0, 2, "spin"), (1.9, 2, "spin"), (1.2, 2, "passive"), (None, 2, "passive"), (8.0, 1, "passive"),
])
def test_auto_spins_only_when_every_thread_finds_an_idle_cpu(idle: float | None, threads: int, expected: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3}, raising=False)
    assert cpu_wait.choose("auto", threads, idle=lambda: idle) == expected


def test_auto_counts_only_the_cpus_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0}, raising=False)
    assert cpu_wait.choose("auto", None, idle=lambda: 16.0) == "passive"  # torch's default: one thread here
    assert cpu_wait.choose("auto", 2, idle=lambda: 16.0) == "passive"  # two threads cannot both find one CPU


@pytest.mark.parametrize("wait", ["passive", "spin", "active"])
def test_an_explicit_policy_is_kept_whatever_the_machine(wait: str) -> None:
    assert cpu_wait.choose(wait, 2, idle=lambda: 0.0) == wait


def test_the_environment_gets_libgomps_variables() -> None:
    env = {"OMP_WAIT_POLICY": "ACTIVE", "PATH": "/bin"}
    assert cpu_wait.apply("spin", 2, env) == "spin"
    assert env == {"GOMP_SPINCOUNT": cpu_wait.SPIN_COUNT, "PATH": "/bin"}
    assert cpu_wait.apply("passive", 2, env) == "passive"
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "PATH": "/bin"}


def test_under_auto_the_operators_variables_stay() -> None:
    env = {"GOMP_SPINCOUNT": "1000"}
    assert cpu_wait.apply("auto", 2, env) == "environment"
    assert env == {"GOMP_SPINCOUNT": "1000"}


def test_idle_cpus_reads_this_machine() -> None:
    idle = cpu_wait.idle_cpus(0.05)
    assert idle is not None and 0.0 <= idle <= (os.cpu_count() or 1)


WORKER_CPU = """
import json, os, sys, time
from tidegate import cpu_wait
cpu_wait.apply(sys.argv[1], 2)
import torch
torch.set_num_threads(2)
a = torch.randn(512, 512)
for _ in range(20):
    a @ a  # a parallel region: its worker then waits for the next one
def others():  # (CPU seconds, all asleep) of every thread but this one
    me, total, asleep = str(os.getpid()), 0, True
    for task in os.listdir("/proc/self/task"):
        if task != me:
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
            asleep = asleep and fields[0] in "SD"
    return total / os.sysconf("SC_CLK_TCK"), asleep
before = others()[0]
deadline = time.monotonic() + 30  # a starved worker gets there late, a healthy one at once
while time.monotonic() < deadline:
    cpu, asleep = others()
    if asleep if sys.argv[2] == "asleep" else cpu - before >= 0.2:
        break
    time.sleep(0.02)
print(json.dumps({"asleep": asleep, "cpu": cpu - before}))
"""


@pytest.mark.skipif(not Path("/proc/self/task").exists() or (os.cpu_count() or 1) < 2, reason="needs Linux, 2 CPUs")
def test_active_workers_poll_while_spinning_and_passive_ones_sleep() -> None:
    def idle_worker(policy: str, until: str) -> dict[str, Any]:
        env = {k: v for k, v in os.environ.items() if k not in cpu_wait.VARIABLES}
        done = subprocess.run([sys.executable, "-c", WORKER_CPU, policy, until], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=120, check=True)
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    assert idle_worker("passive", "asleep")["asleep"]
    assert idle_worker("spin", "asleep")["asleep"]  # a short poll after each op, then sleep: nothing between steps
    assert idle_worker("active", "cpu")["cpu"] >= 0.2  # keeps polling with nothing to do
