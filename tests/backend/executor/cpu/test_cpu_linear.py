"""oneDNN-packed products equal F.linear; models are packed on CPU in float32 only, with unchanged logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from backend.engine.core import Engine, EngineConfig
from backend.executor.cpu import cpu_linear
from backend.loading.loader import load_model
from tests.backend.model_harness import prefill_logits
from tests.backend.tiny_models import tiny_config, tiny_hf_model, write_gguf

pytestmark = pytest.mark.skipif(not cpu_linear.available(), reason="this torch build has no oneDNN")
PROMPT = [*range(3, 60, 2), 200, 17, 42]


@pytest.mark.parametrize("rows", [1, 7, 32, 130])
def test_packed_product_equals_linear(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(96, 40, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(rows, 40, generator=gen)
    packed = cpu_linear.pack(weight)
    torch.testing.assert_close(cpu_linear.linear(x, packed), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cpu_linear.linear(x, packed, bias), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_packed_product_takes_strided_and_batched_inputs() -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(24, 16, generator=gen)
    packed = cpu_linear.pack(weight)
    strided = torch.randn(10, 16, generator=gen)[::2]
    batched = torch.randn(3, 5, 16, generator=gen)
    torch.testing.assert_close(cpu_linear.linear(strided, packed), F.linear(strided, weight), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cpu_linear.linear(batched, packed), F.linear(batched, weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_packing_keeps_the_model_logits(tmp_path: Path, model_type: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny_config(model_type)
    path = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(config).state_dict(), config)
    packed = load_model(path)
    assert packed.model.packed_head is not None
    assert packed.model.ops.linear is cpu_linear.linear
    monkeypatch.setattr(cpu_linear, "available", lambda: False)
    plain = load_model(path)
    assert plain.model.packed_head is None
    torch.testing.assert_close(
        prefill_logits(packed.model, PROMPT), prefill_logits(plain.model, PROMPT), rtol=1e-5, atol=1e-5
    )


def test_other_dtypes_keep_plain_matrices(tmp_path: Path) -> None:
    config = tiny_config("llama")
    path = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(config).state_dict(), config)
    loaded = load_model(path, dtype=torch.bfloat16)
    assert loaded.model.packed_head is None
    assert loaded.model.ops.linear is F.linear


def test_engine_load_errors_reach_the_caller(tmp_path: Path) -> None:
    # The model loads in a passing thread; its failure is raised where the engine was built.
    with pytest.raises(FileNotFoundError, match="model not found"):
        Engine(EngineConfig(model_path=tmp_path / "missing.gguf"))
