"""Quantized products equal the dense product of the weights they hold; models load quantized as `--quantization`
says, with logits close to the float model's. (The default model answering in `auto`, the backend's default, is
pinned end to end by tests/backend/server/test_sampling_api.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from backend.executor.cpu import block_kernel
from backend.executor.cpu.block_linear import BlockWeight
from backend.executor.cpu.quant_blocks import BlockQuantized
from backend.executor.model import quantized_linear
from backend.executor.model.quantized_linear import (
    Int4Weight,
    Int8Weight,
    StackedWeight,
    quantize_int4,
    quantize_int8,
)
from backend.executor.model.vocabulary import Vocabulary
from backend.loading.loader import load_model
from tests.backend.model_harness import prefill_logits
from tests.backend.tiny_models import tiny_config, tiny_hf_model, write_gguf

pytestmark = pytest.mark.skipif(not quantized_linear.available(), reason="this torch build lacks the CPU kernels")
PROMPT = [*range(3, 60, 2), 200, 17, 42]


def _blocks(kind: str, rows: int = 96, cols: int = 128, seed: int = 0) -> tuple[BlockQuantized, np.ndarray]:
    w = np.random.default_rng(seed).normal(0, 0.05, (rows, cols)).astype(np.float32)
    raw = quantize(w, Q[kind])
    return BlockQuantized(kind, torch.from_numpy(raw), (rows, cols)), dequantize(raw, Q[kind])


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out - ref).norm() / ref.norm())


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_blocks_dequantize_to_the_files_values(kind: str) -> None:
    blocks, reference = _blocks(kind)
    assert torch.equal(blocks.dequantize(), torch.from_numpy(reference))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows", [1, 7, 33])
def test_block_products_equal_the_dense_product(kind: str, rows: int) -> None:
    blocks, reference = _blocks(kind, seed=rows)
    weight = quantize_int8(blocks) if kind == "Q8_0" else quantize_int4(blocks)
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows))
    # bfloat16 activations and scales: about three significant digits (Q8_0 also loses its per-block scales)
    dense = F.linear(x.bfloat16().float(), torch.from_numpy(reference))
    assert _relative_error(weight.linear(x), dense) < (1e-2 if kind == "Q8_0" else 5e-3)


def test_products_take_batched_inputs_and_a_bias() -> None:
    gen = torch.Generator().manual_seed(0)
    w, bias, x = torch.randn(64, 96, generator=gen), torch.randn(64, generator=gen), torch.randn(2, 5, 96, generator=gen)
    for weight, bound in ((quantize_int8(w), 1e-2), (quantize_int4(w), 0.12)):
        out = weight.linear(x, bias)
        assert out.shape == (2, 5, 64) and out.dtype == torch.float32
        assert _relative_error(out - bias, F.linear(x, w)) < bound


def test_int8_rows_are_the_embedding_lookup() -> None:
    w = torch.randn(50, 64, generator=torch.Generator().manual_seed(1))
    table = quantize_int8(w)
    ids = torch.tensor([3, 0, 49, 3])
    assert _relative_error(table.rows(ids, torch.float32), w[ids]) < 1e-2


@pytest.fixture
def without_block_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(block_kernel, "load", lambda: None)


@pytest.mark.usefixtures("without_block_kernel")
def test_vocabulary_rows_are_the_files_and_its_leading_logits_float32() -> None:
    blocks, reference = _blocks("Q8_0", rows=300, cols=64)
    vocab, table = Vocabulary(quantize_int8(blocks), blocks), torch.from_numpy(reference)
    ids = torch.tensor([5, 0, 299, 5])
    assert torch.equal(vocab.rows(ids, torch.float32), table[ids])
    hidden = torch.randn(3, 64, generator=torch.Generator().manual_seed(3))
    logits, exact = vocab.linear(hidden), hidden @ table.T
    leading = exact.topk(4, dim=-1)
    torch.testing.assert_close(logits.gather(1, leading.indices), leading.values)
    assert _relative_error(logits, exact) < 1e-2


def _tiny_gguf(tmp_path: Path, types: dict[str, Q]) -> Path:
    config = tiny_config("llama", tie_word_embeddings=True)
    state = {k: v for k, v in tiny_hf_model(config).state_dict().items() if k != "lm_head.weight"}
    return write_gguf(tmp_path / "tiny.gguf", state, config, types=types)


BLOCK_TYPES = {
    **{f"blk.{i}.{m}.weight": Q.Q4_1 for i in (0, 1) for m in ("attn_q", "attn_k", "attn_v", "ffn_gate")},
    **{f"blk.{i}.{m}.weight": Q.Q4_0 for i in (0, 1) for m in ("attn_output", "ffn_up")},
    "blk.0.ffn_down.weight": Q.Q8_0,
    "blk.1.ffn_down.weight": Q.F16,
    "token_embd.weight": Q.Q8_0,
}


@pytest.fixture(params=["avx2", "avx512"])
def gemm_isa(request: pytest.FixtureRequest) -> Iterator[str]:
    """The block kernel's prefill GEMM forced to AVX2 (exact float32) or AVX-512 VNNI (16-bit activations)."""
    kernel = block_kernel.load()
    if kernel is None:
        pytest.skip("the block kernel does not build here")
    if not (kernel.uses_avx512_vnni() if request.param == "avx512" else kernel.uses_avx2()):
        pytest.skip(f"this CPU lacks {request.param}")
    kernel.set_isa(request.param)
    yield request.param
    kernel.set_scalar_only(False)


# Exact prefill products differ from the float model only in summation order; with 16-bit activations (AVX-512
# VNNI) each product is also off by the activations' rounding, ~2e-5 of its norm.
PREFILL_TOLERANCE = {"avx2": 1e-5, "avx512": 2e-4}


def test_auto_multiplies_the_files_blocks_exactly(tmp_path: Path, gemm_isa: str) -> None:
    path = _tiny_gguf(tmp_path, BLOCK_TYPES)
    exact, auto = load_model(path).model, load_model(path, quantization="auto").model
    first, second = auto.layers[0], auto.layers[1]
    assert all(isinstance(m, BlockWeight) for m in (first.qkv_proj, first.o_proj, first.down_proj))
    assert isinstance(first.gate_up_proj, StackedWeight), "Q4_1 gate and Q4_0 up stay two block matrices"
    assert [p.kind for p in first.gate_up_proj.parts] == ["Q4_1", "Q4_0"]
    assert isinstance(second.down_proj, torch.Tensor)
    assert isinstance(auto.embed_tokens, Vocabulary) and auto.lm_head is auto.embed_tokens
    assert isinstance(auto.embed_tokens.table, BlockWeight)
    # the file's values: only the summation order (and on VNNI the activations' rounding) differs from the float model
    assert _relative_error(prefill_logits(auto, PROMPT), prefill_logits(exact, PROMPT)) < PREFILL_TOLERANCE[gemm_isa]


@pytest.mark.usefixtures("without_block_kernel")
def test_auto_without_the_block_kernel_keeps_torchs_forms(tmp_path: Path) -> None:
    path = _tiny_gguf(tmp_path, BLOCK_TYPES)
    exact, auto = load_model(path).model, load_model(path, quantization="auto").model
    first, second = auto.layers[0], auto.layers[1]
    assert isinstance(first.qkv_proj, Int4Weight) and isinstance(first.o_proj, Int4Weight)
    assert isinstance(first.down_proj, Int8Weight) and isinstance(second.down_proj, torch.Tensor)
    assert isinstance(auto.embed_tokens, Vocabulary) and auto.lm_head is auto.embed_tokens
    assert isinstance(auto.embed_tokens.table, Int8Weight)
    assert isinstance(exact.layers[0].qkv_proj, torch.Tensor)
    assert _relative_error(prefill_logits(auto, PROMPT), prefill_logits(exact, PROMPT)) < 0.02


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_float_weights_are_quantized_at_load(tmp_path: Path, mode: str) -> None:
    path = _tiny_gguf(tmp_path, {})
    exact, quantized = load_model(path, quantization="auto").model, load_model(path, quantization=mode).model
    assert isinstance(exact.layers[0].gate_up_proj, torch.Tensor)  # float files stay float in auto
    kind = Int8Weight if mode == "int8" else Int4Weight
    assert all(isinstance(layer.gate_up_proj, kind) for layer in quantized.layers)
    assert isinstance(quantized.lm_head, Vocabulary)
    bound = 0.02 if mode == "int8" else 0.15
    assert _relative_error(prefill_logits(quantized, PROMPT), prefill_logits(exact, PROMPT)) < bound

