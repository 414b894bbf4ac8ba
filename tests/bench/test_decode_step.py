"""benchmarks/backend/decode_step.py on the real model at tiny sizes: it times a step and the products, wall and CPU,
for each batch asked, in either thread, over scattered or consecutive blocks."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from backend.loading.loader import LoadedModel
from benchmarks.backend import decode_step


@pytest.mark.parametrize("where", [[], ["--thread", "--consecutive"]])
def test_reports_step_and_products_for_each_batch(
    where: list[str], loaded_model: LoadedModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The script runs in this process on the session's model: in a subprocess of its own, loading it took 14 s
    # of each case's 17.
    def load_model(path: Path, quantization: str) -> LoadedModel:
        assert quantization == "none"
        return loaded_model

    monkeypatch.setattr(decode_step, "load_model", load_model)
    args = ["--batch", "1,2", "--context", "20", "--runs", "2", "--threads", "1", *where]
    monkeypatch.setattr(sys, "argv", ["decode_step", *args])
    decode_step.main()
    out = capsys.readouterr().out
    found = re.findall(r"batch (\d+), context 20, 1 threads, in (.+): ([\d.]+) ms median \(([\d.]+) CPU ms\); "
                       r"weight products alone ([\d.]+) ms \(([\d.]+) CPU ms\)", out)
    assert [batch for batch, *_ in found] == ["1", "2"], out
    for _, thread, *times in found:
        assert thread == ("a second thread" if where else "the main thread")
        assert all(float(t) > 0 for t in times)
