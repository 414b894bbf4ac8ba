"""Every kernel compiles for Hopper (sm_90) without a GPU, in its own process so nothing is interpreted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]


def test_every_kernel_compiles_to_a_hopper_cubin() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.backend.executor.kernels.gpu_compile"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert len(lines) == 11 and all(line.startswith("OK ") for line in lines), proc.stdout
