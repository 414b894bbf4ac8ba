"""benchmarks/backend/offline.py end to end on the real model, tiny sizes: both sides run and the table
compares them."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import pytest
import transformers

from backend.engine.core import Engine
from backend.loading.loader import LoadedModel
from benchmarks.backend import offline


def test_fixed_scenario_reports_both_sides(
    model_path: Path, loaded_model: LoadedModel, hf_model: Any, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The script runs in this process on the session's two models: in a subprocess, loading them was 45 s of
    # the test's 56; everything it does with them is its own.
    monkeypatch.setattr(offline, "Engine", functools.partial(Engine, loaded=loaded_model))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *args, **kwargs: hf_model)
    args = [
        "--model", str(model_path), "--scenario", "fixed", "--num-requests", "3", "--input-len", "20",
        "--output-len", "4", "--threads", "1", "--kv-cache-memory", str(64 << 20),
    ]
    monkeypatch.setattr(sys, "argv", ["offline", *args])
    offline.main()
    out = capsys.readouterr().out
    # The engine finishes (and prints) before transformers starts: one side at a time.
    assert out.index("tidegate fixed") < out.index("transformers fixed")
    row = next(line for line in out.splitlines() if line.startswith("| fixed 3x(20 in, 4 out)"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1].endswith("tok/s") and cells[2].endswith("tok/s") and cells[3].endswith("x")
    assert float(cells[1].split()[0]) > 0 and float(cells[2].split()[0]) > 0
