"""The parts of benchmarks/gpu/check.sh that run without a GPU: the workload and the joined report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gpu import check as gpu_check
from benchmarks.gpu.throughput import nano_vllm_workload


def test_nano_vllm_workload_is_reproducible_and_in_range() -> None:
    workload = nano_vllm_workload()
    assert len(workload) == 256
    assert all(100 <= len(p) <= 1024 and all(0 <= t <= 10000 for t in p) for p, _ in workload)
    assert all(100 <= sp.max_tokens <= 1024 and sp.ignore_eos for _, sp in workload)
    again = nano_vllm_workload()
    assert [p for p, _ in again] == [p for p, _ in workload]
    assert [sp.max_tokens for _, sp in again] == [sp.max_tokens for _, sp in workload]


def test_report_joins_phases_and_names_the_missing_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "phases"
    out.mkdir()
    kernels = {"passed": True, "summary": "95 passed in 40.0s"}
    decode_row = {
        "batch": 1, "context": 512, "triton_step_ms": 5.0, "torch_step_ms": 6.0, "torch_over_triton": 1.2,
        "triton_attention_layer_ms": 0.01, "torch_attention_layer_ms": 0.02, "attention_torch_over_triton": 2.0,
        "weight_gbps": 3000.0, "weight_plus_kv_gbps": 3001.0, "weight_fraction_of_copy": 0.75,
        "graph_step_ms": None, "graph_step_error": "RuntimeError('capture failed')",
    }
    (out / "kernels.json").write_text(json.dumps(kernels))
    (out / "decode.json").write_text(json.dumps({"rows": [decode_row]}))
    (out / "throughput.json").write_text(json.dumps({"skipped": "model not found at /nowhere"}))

    joined = tmp_path / "result.json"
    assert gpu_check.main(["report", "--out", str(out), "--json", str(joined)]) == 0
    table = capsys.readouterr().out
    assert "micro: no result" in table and "kernels vs torch reference on GPU: PASS" in table
    assert "| 1 | 512 | 5.0 | 6.0 | 1.2x | 2.0x | 3000.0 | 0.75 | - | - |" in table
    assert "batch 1 graph_step failed: RuntimeError('capture failed')" in table
    assert "SmolLM2 throughput: skipped (model not found at /nowhere)" in table
    assert json.loads(joined.read_text()) == {
        "kernels": kernels,
        "decode": {"rows": [decode_row]},
        "throughput": {"skipped": "model not found at /nowhere"},
    }


def test_report_fails_when_the_kernel_phase_failed_or_is_missing(tmp_path: Path) -> None:
    assert gpu_check.main(["report", "--out", str(tmp_path)]) == 1
    (tmp_path / "kernels.json").write_text(json.dumps({"passed": False, "summary": "1 failed"}))
    assert gpu_check.main(["report", "--out", str(tmp_path)]) == 1


def test_report_shows_a_failed_path_beside_the_measured_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    triton = {"completed": False, "seconds": 60.0, "output_tokens": 90000, "output_tokens_per_s": 1500.0}
    throughput = {"triton": triton, "torch": {"error": "RuntimeError('device mismatch')"}, "triton_over_torch": None}
    (tmp_path / "kernels.json").write_text(json.dumps({"passed": False, "summary": "1 failed", "failed": ["t::x"]}))
    (tmp_path / "throughput.json").write_text(json.dumps(throughput))
    assert gpu_check.main(["report", "--out", str(tmp_path)]) == 1
    table = capsys.readouterr().out
    assert "FAIL (1 failed)" in table and "  failed: t::x" in table
    assert "SmolLM2 triton: 1500.0 output tok/s (90000 tokens, 60.0 s, capped)" in table
    assert "SmolLM2 torch: failed: RuntimeError('device mismatch')" in table
