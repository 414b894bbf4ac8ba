"""The routed experts of Qwen3-MoE and Mixtral (families/moe.py): a quantized GGUF's experts kept in the file's
blocks under `--quantization auto` and near the float products of the same weights, float experts in torch's
int8/int4 forms on request, and Mixtral's older files (one tensor per expert) equal to the stacked ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from backend.executor.model.config import ModelConfig
from backend.executor.model.families.moe import Expert, RoutedLayer
from backend.executor.model.model import LlamaModel
from backend.loading.gguf.writer import gguf_tensors, uniform, write_gguf
from backend.loading.loader import load_model
from tests.backend.family_models import FAMILIES, build, write_family_gguf
from tests.backend.model_harness import prefill_logits
from tests.backend.tiny_models import BYTE_VOCAB

PROMPTS = [[72, 101, 108, 108, 111], [100, 101, 102, 32, 102, 40, 120, 41, 58] * 3]
# The block products take the file's values exactly, rounding only the activations of products of up to 8 rows
# (an expert's share of a short prompt) to 16 bits: the tiny models' logits (|logit| ~ 1) agree to this whatever
# the weight type. Torch's int8/int4 forms requantize float weights, int4 in 16 levels per 32 values.
BLOCK_ATOL = {Q.Q8_0: 0.05, Q.Q4_0: 0.05, Q.Q4_1: 0.05}
TORCH_FORM_ATOL = {"int8": 0.01, "int4": 0.05}


@pytest.fixture(scope="module", params=["qwen3moe", "mixtral"])
def moe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    spec = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(spec.name)
    return {"spec": spec, "hf": build(spec, root / "hf"), "root": root}


def _expert_matrices(model: LlamaModel) -> list[object]:
    layers = [layer for layer in model.layers if isinstance(layer, RoutedLayer)]
    assert len(layers) == model.config.num_layers
    return [getattr(expert, name) for layer in layers for expert in layer.routed.experts
            for name in Expert.MATRICES]


def _assert_logits_near(model: LlamaModel, reference: LlamaModel, atol: float) -> None:
    for prompt in PROMPTS:
        torch.testing.assert_close(prefill_logits(model, prompt), prefill_logits(reference, prompt), rtol=0, atol=atol)


@pytest.mark.parametrize("qtype", sorted(BLOCK_ATOL), ids=lambda q: q.name)
def test_quantized_experts_multiply_the_files_blocks(moe: dict[str, Any], qtype: Q) -> None:
    path = write_family_gguf(moe["spec"], moe["hf"], moe["root"] / f"{qtype.name}.gguf", qtype)
    native = load_model(path, quantization="auto")
    dequantized = load_model(path)
    kinds = {type(m).__name__ for m in _expert_matrices(native.model)}
    assert kinds == {"BlockWeight"}, kinds
    assert all(isinstance(m, torch.Tensor) for m in _expert_matrices(dequantized.model))
    _assert_logits_near(native.model, dequantized.model, BLOCK_ATOL[qtype])


@pytest.mark.parametrize("form", sorted(TORCH_FORM_ATOL))
def test_float_experts_take_the_requested_torch_form(moe: dict[str, Any], form: str) -> None:
    folder = moe["root"] / "hf"
    quantized = load_model(folder, quantization=form)
    assert {type(m).__name__ for m in _expert_matrices(quantized.model)} == {f"Int{form[3:]}Weight"}
    _assert_logits_near(quantized.model, load_model(folder).model, TORCH_FORM_ATOL[form])


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q4_0], ids=lambda q: q.name)
def test_mixtral_files_with_one_tensor_per_expert_equal_stacked_ones(tmp_path: Path, qtype: Q) -> None:
    spec = FAMILIES["mixtral"]
    hf = build(spec, tmp_path / "hf")
    stacked = load_model(write_family_gguf(spec, hf, tmp_path / "stacked.gguf", qtype), quantization="auto")
    split_path = write_family_gguf(spec, hf, tmp_path / "split.gguf", qtype, per_expert=True)
    split = load_model(split_path, quantization="auto")
    assert "blk.0.ffn_gate.7.weight" in {t.name for t in gguf.GGUFReader(split_path).tensors}
    for prompt in PROMPTS:
        assert torch.equal(prefill_logits(split.model, prompt), prefill_logits(stacked.model, prompt))


def test_expert_count_unlike_the_tensors_is_refused(tmp_path: Path) -> None:
    model = build(FAMILIES["mixtral"], tmp_path / "hf")
    raw = model.config.to_dict()
    tensors = gguf_tensors(ModelConfig.from_hf_config(raw), model.state_dict().items())
    # the metadata says 4 experts, the tensors hold 8
    path = write_gguf(tmp_path / "wrong.gguf", {**raw, "num_local_experts": 4}, BYTE_VOCAB, tensors, uniform(Q.Q8_0))
    for quantization in ("auto", "none"):
        with pytest.raises(ValueError, match="does not match the model's"):
            load_model(path, quantization=quantization)
