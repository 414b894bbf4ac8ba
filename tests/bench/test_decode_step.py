"""bench/experiments/decode_step.py on the real model at tiny sizes: it times a step and the products, wall and CPU,
for each batch asked, in either thread, over scattered or consecutive blocks."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.parametrize("where", [[], ["--thread", "--consecutive"]])
def test_reports_step_and_products_for_each_batch(where: list[str]) -> None:
    args = ["--batch", "1,2", "--context", "20", "--runs", "2", "--threads", "1", *where]
    run = subprocess.run([sys.executable, "-m", "bench.experiments.decode_step", *args], capture_output=True, text=True,
                         timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    found = re.findall(r"batch (\d+), context 20, 1 threads, in (.+): ([\d.]+) ms median \(([\d.]+) CPU ms\); "
                       r"weight products alone ([\d.]+) ms \(([\d.]+) CPU ms\)", run.stdout)
    assert [batch for batch, *_ in found] == ["1", "2"], run.stdout
    for _, thread, *times in found:
        assert thread == ("a second thread" if where else "the main thread")
        assert all(float(t) > 0 for t in times)
