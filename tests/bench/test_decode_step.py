"""bench/experiments/decode_step.py on the real model at tiny sizes: it times a step and the products, in either
thread."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.parametrize("where", [[], ["--thread"]])
def test_reports_step_and_products(where: list[str]) -> None:
    args = ["--batch", "2", "--context", "20", "--runs", "2", "--threads", "1", *where]
    run = subprocess.run([sys.executable, "-m", "bench.experiments.decode_step", *args], capture_output=True, text=True,
                         timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    found = re.search(r"batch 2, context 20, 1 threads, in (.+): ([\d.]+) ms median; weight products alone ([\d.]+) ms",
                      run.stdout)
    assert found is not None, run.stdout
    assert found.group(1) == ("a second thread" if where else "the main thread")
    assert float(found.group(2)) > 0 and float(found.group(3)) > 0
