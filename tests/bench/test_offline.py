"""bench/experiments/offline.py end to end on the real model, tiny sizes: both sides run and the table
compares them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_fixed_scenario_reports_both_sides(model_path: Path) -> None:
    args = [
        "--model", str(model_path), "--scenario", "fixed", "--num-requests", "3", "--input-len", "20",
        "--output-len", "4", "--threads", "1", "--kv-cache-memory", str(64 << 20),
    ]
    run = subprocess.run(
        [sys.executable, "-m", "bench.experiments.offline", *args],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout
    # The engine finishes (and prints) before transformers starts: one side at a time.
    assert out.index("tidegate fixed") < out.index("transformers fixed")
    row = next(line for line in out.splitlines() if line.startswith("| fixed 3x(20 in, 4 out)"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1].endswith("tok/s") and cells[2].endswith("tok/s") and cells[3].endswith("x")
    assert float(cells[1].split()[0]) > 0 and float(cells[2].split()[0]) > 0
