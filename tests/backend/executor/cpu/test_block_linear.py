"""The block kernel multiplies with the file's own Q4_0/Q4_1/Q5_0/Q8_0 values: its exact products equal the float32
product of the dequantized matrix up to summation order, its decode products with 8-bit activations equal
llama.cpp's integer arithmetic (the same quantized activations, bit for bit, on the AVX2 and the portable path),
within a stated tolerance of the exact product, and so do its products of many rows on AVX-512 VNNI; the default model answers alike in `auto` and `none`; and where
the kernel cannot be built the quantized forms fall back to torch's, still correct."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from backend.executor.cpu import block_kernel
from backend.executor.cpu.block_linear import BlockWeight, from_blocks, interleave
from backend.executor.cpu.quant_blocks import OFFSETS, BlockQuantized
from backend.executor.model.model import LlamaModel
from backend.executor.model.quantized_linear import Int4Weight, Int8Weight, form_for
from backend.executor.model.quantized_linear import quantize as quantize_form
from backend.loading.gguf.weights import read_gguf
from backend.loading.tokenizer import Tokenizer
from tests.backend import engine_fixtures
from tests.backend.model_harness import paged_greedy
from tests.backend.torch_threads import torch_threads

KINDS = ["Q4_0", "Q4_1", "Q5_0", "Q8_0"]
kernel = block_kernel.load()
needs_kernel = pytest.mark.skipif(kernel is None, reason="the block kernel does not build here")


def _blocks(kind: str, rows: int = 77, cols: int = 96, seed: int = 0) -> tuple[BlockQuantized, torch.Tensor]:
    """A matrix in `kind` blocks (out-features 77: not a multiple of any tile) and the file's float32 values."""
    w = np.random.default_rng(seed).normal(0, 0.05, (rows, cols)).astype(np.float32)
    raw = quantize(w, Q[kind])
    return BlockQuantized(kind, torch.from_numpy(raw), (rows, cols)), torch.from_numpy(dequantize(raw, Q[kind]))


def _exact(blocks: BlockQuantized) -> BlockWeight:
    assert kernel is not None
    return from_blocks(blocks, kernel, "float32")


def _assert_matches(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """Equal up to float32 summation order: within 1e-5 of |x| @ |w|.T, element by element."""
    bound = x.abs() @ w.abs().T
    assert out.shape == bound.shape
    assert bool(((out - F.linear(x, w)).abs() <= 1e-5 * bound).all())


@pytest.fixture(params=["avx512", "avx2", "scalar"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each instruction set the kernel has, forced: AVX-512 VNNI (products of many rows with integer activations),
    AVX2, and the portable path."""
    assert kernel is not None
    if request.param == "avx512" and not kernel.uses_avx512_vnni():
        pytest.skip("this CPU lacks AVX-512 VNNI")
    if request.param == "avx2" and not kernel.uses_avx2():
        pytest.skip("this CPU lacks AVX2+FMA+F16C")
    kernel.set_isa(request.param)
    yield request.param
    kernel.set_scalar_only(False)  # back to the CPU's widest (or TIDEGATE_CPU_ISA's)


def test_interleave_alternates_the_rows_of_a_group_in_units_and_pads_the_last_group() -> None:
    """Rows 0-7 form group 0 and rows 8-10 (and 5 zero rows) group 1; within a group's block, unit u of row i
    sits at u * 8 * unit + i * unit, so a 16-byte load of 2-byte units holds 8 rows side by side."""
    rows, blocks, n = 11, 3, 16
    per_row = torch.arange(rows * blocks * n, dtype=torch.int32).view(rows, blocks, n)
    packed = interleave(per_row, 2)
    assert packed.shape == (2, blocks * 8 * n)
    group_blocks = packed.view(2, blocks, n // 2, 8, 2)  # [group][block][unit][row][byte]
    for o in range(rows):
        for b in range(blocks):
            for u in range(n // 2):
                assert group_blocks[o // 8, b, u, o % 8].tolist() == per_row[o, b, 2 * u:2 * u + 2].tolist()
    assert not group_blocks[1, :, :, 3:].any()  # the padding rows of the last group


@needs_kernel
@pytest.mark.parametrize("kind", KINDS)
def test_dequantized_rows_are_the_files_values(kind: str, path: str) -> None:
    blocks, reference = _blocks(kind)
    assert kernel is not None
    weight = from_blocks(blocks, kernel)
    assert torch.equal(weight.dequantize(), reference)
    ids = torch.tensor([5, 0, 76, 5])
    assert torch.equal(weight.rows(ids, torch.float32), reference[ids])


@needs_kernel
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 33])
def test_kernel_product_equals_the_dense_product(kind: str, rows: int, path: str) -> None:
    blocks, reference = _blocks(kind, seed=rows)
    assert kernel is not None
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
    _assert_matches(_exact(blocks).linear(x), x, reference)


@pytest.fixture
def two_threads() -> Iterator[None]:
    with torch_threads(2):
        yield


@needs_kernel
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 8, 40])
def test_products_split_over_threads_equal_the_dense_product(kind: str, rows: int, path: str, two_threads: None) -> None:
    """Many output rows and panels (past a tile's grain), so the threads each take a share."""
    blocks, reference = _blocks(kind, rows=1000, cols=256, seed=rows)
    assert kernel is not None
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
    _assert_matches(_exact(blocks).linear(x), x, reference)


@needs_kernel
def test_a_long_prefill_chunk_keeps_its_shape_and_bias() -> None:
    blocks, reference = _blocks("Q4_1", rows=300, cols=64)
    assert kernel is not None
    x = torch.randn(2, 260, 64, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(300, generator=torch.Generator().manual_seed(2))
    out = _exact(blocks).linear(x, bias)
    assert out.shape == (2, 260, 300)
    _assert_matches((out - bias).reshape(-1, 300), x.reshape(-1, 64), reference)


INTEGER = ["int8", "int16"]
LEVELS = {"int8": 127, "int16": 32767}  # the largest |q| of a block


def _quantized_rows(x: torch.Tensor, activations: str) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's quantize_row_q8_1 in torch, for L = 127 (int8) or 32767 (int16): per 32 values a scale
    max|x| / L and round(x / scale), to nearest even (a block whose max|x| is below 1e-30: values 0)."""
    levels, blocks = LEVELS[activations], x.view(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1)
    inverse = torch.where(amax >= 1e-30, torch.full_like(amax, levels) / amax, 0.0)  # L / amax, as the kernel divides
    q = torch.round(blocks * inverse.unsqueeze(-1)).to(getattr(torch, activations)).view_as(x)
    return q, amax / levels


def _integer_product(x: torch.Tensor, blocks: BlockQuantized, activations: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The product in float64 from exact integer dot products per block, and the sum of the magnitudes of its
    terms (what float32 rounding scales with)."""
    q, dx = _quantized_rows(x, activations)
    wq, dw, mw = blocks.quants()
    wq = wq - OFFSETS.get(blocks.kind, 0)
    (rows, cols), out = x.shape, blocks.shape[0]
    xb, wb = q.view(rows, cols // 32, 32).long(), wq.view(out, cols // 32, 32).long()
    scale = dx.double().unsqueeze(1) * dw.double().unsqueeze(0)  # [rows, out, blocks]
    value = (torch.einsum("rbj,obj->rob", xb, wb).double() * scale).sum(-1)
    bound = (torch.einsum("rbj,obj->rob", xb.abs(), wb.abs()).double() * scale.abs()).sum(-1)
    if mw is not None:  # Q4_1: m * dx * sum(q) per block
        minimum = mw.double().unsqueeze(0) * (dx.double() * xb.sum(-1).double()).unsqueeze(1)
        value += minimum.sum(-1)
        bound += minimum.abs().sum(-1)
    return value, bound


def _assert_integer_product(out: torch.Tensor, x: torch.Tensor, blocks: BlockQuantized, activations: str) -> None:
    value, bound = _integer_product(x, blocks, activations)
    assert out.shape == value.shape and not out.isnan().any()
    assert bool(((out.double() - value).abs() <= 1e-5 * bound).all())


def _assert_product(out: torch.Tensor, x: torch.Tensor, blocks: BlockQuantized, activations: str, path: str) -> None:
    """1 to 8 rows, and on AVX-512 VNNI any number, multiply in integers; more rows elsewhere exactly."""
    if x.shape[0] <= 8 or path == "avx512":
        _assert_integer_product(out, x, blocks, activations)
    else:
        _assert_matches(out, x, torch.from_numpy(dequantize(blocks.blocks.numpy(), Q[blocks.kind])))


def _integer(blocks: BlockQuantized, activations: str) -> BlockWeight:
    assert kernel is not None
    return from_blocks(blocks, kernel, activations)


@needs_kernel
@pytest.mark.parametrize("activations", INTEGER)
def test_activations_quantize_as_llama_cpp_does_on_both_paths(activations: str, path: str) -> None:
    """The same integers and scales from the AVX2 and the scalar path: ties round to even, a zero or tiny block
    to 0."""
    assert kernel is not None
    levels = LEVELS[activations]
    x = torch.randn(5, 288, generator=torch.Generator().manual_seed(5))
    x[1, :32] = torch.tensor([levels, 0.5, 1.5, 2.5, -0.5, -1.5] + [0.0] * 26)  # scale 1: x / scale ties exactly
    x[2] = 0.0
    x[3, 64:96] = 0.0
    x[4, 32:64] = 0.0
    x[4, 32] = 1e-36  # L / max|x| would overflow to infinity (and 0 * infinity is NaN): the block rounds to 0
    q, d, s = kernel.quantize_activations(x, int(activations[3:]))
    expected_q, expected_d = _quantized_rows(x, activations)
    assert torch.equal(q, expected_q) and torch.equal(d, expected_d)
    assert q[1, :6].tolist() == [levels, 0, 2, 2, 0, -2] and not q[4, 32:64].any()
    assert torch.equal(s, d * q.view(5, -1, 32).sum(-1).float())


@needs_kernel
@pytest.mark.parametrize("activations", INTEGER)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("rows", "cols"), [(1, 1056), (2, 96), (3, 288), (4, 96), (5, 1056), (6, 288), (7, 96),
                                           (8, 288), (9, 96), (11, 1056), (13, 288), (40, 96)])
def test_integer_products_equal_exact_integer_dot_products(
    kind: str, rows: int, cols: int, activations: str, path: str
) -> None:
    """Odd shapes: 3 blocks (all tail), 9 and 33 (past a chunk of 32) blocks a row, 77 output rows (2 wide panels
    of 32, the second part padding); from 9 rows, tiles of 6 activation rows with 1- to 5-row tails."""
    blocks, _ = _blocks(kind, cols=cols, seed=rows)
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows))
    _assert_product(_integer(blocks, activations).linear(x), x, blocks, activations, path)


@needs_kernel
@pytest.mark.parametrize("activations", INTEGER)
@pytest.mark.parametrize("kind", KINDS)
def test_vnni_many_rows_equal_the_decode_products_of_the_same_rows(kind: str, activations: str) -> None:
    """The integer GEMM quantizes each row as the decode path does, so a prefill of 21 rows gives each row what a
    decode step of it alone would, up to the order of the float32 sums of the blocks."""
    assert kernel is not None
    if not kernel.uses_avx512_vnni():
        pytest.skip("this CPU lacks AVX-512 VNNI")
    blocks, _ = _blocks(kind, rows=100, cols=288, seed=2)
    weight = _integer(blocks, activations)
    x = torch.randn(21, 288, generator=torch.Generator().manual_seed(2))
    _, bound = _integer_product(x, blocks, activations)
    one_by_one = torch.cat([weight.linear(x[i : i + 1]) for i in range(21)])
    assert bool(((weight.linear(x) - one_by_one).abs().double() <= 1e-5 * bound).all())


@needs_kernel
@pytest.mark.parametrize("activations", INTEGER)
@pytest.mark.parametrize("kind", KINDS)
def test_scalar_and_avx2_integer_paths_agree(kind: str, activations: str) -> None:
    """The same integers on both paths; only the order of the float32 sums of the blocks differs."""
    assert kernel is not None
    if not kernel.uses_avx2():
        pytest.skip("this CPU lacks AVX2+FMA+F16C")
    blocks, _ = _blocks(kind, cols=1056)
    weight = _integer(blocks, activations)
    x = torch.randn(3, 1056, generator=torch.Generator().manual_seed(3))
    avx2 = weight.linear(x)
    kernel.set_scalar_only(True)
    try:
        scalar = weight.linear(x)
    finally:
        kernel.set_scalar_only(False)
    _, bound = _integer_product(x, blocks, activations)
    assert bool(((avx2 - scalar).abs().double() <= 1e-5 * bound).all())


@needs_kernel
@pytest.mark.parametrize("activations", INTEGER)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [4, 40])
def test_integer_products_split_over_threads_equal_exact_integer_dot_products(
    kind: str, activations: str, rows: int, path: str, two_threads: None
) -> None:
    """1,000 output rows (wide panels and groups split over the threads), 40 rows (quantized by both threads)."""
    blocks, _ = _blocks(kind, rows=1000, cols=256, seed=4)
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(4))
    _assert_product(_integer(blocks, activations).linear(x), x, blocks, activations, path)


@needs_kernel
@pytest.mark.parametrize("activations", INTEGER)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [3, 12])
def test_zero_and_tiny_activations_give_zeros_not_nan(kind: str, activations: str, rows: int, path: str) -> None:
    blocks, _ = _blocks(kind)
    weight = _integer(blocks, activations)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(3))
    x[0] = 0.0
    x[1, 32:64] = 0.0  # one block of scale 0 among others
    x[2, 64:96] = 1e-36  # so small that L / max|x| would overflow: rounded to zeros too
    out = weight.linear(x)
    assert torch.equal(out[0], torch.zeros(77)) and not out.isnan().any()
    _assert_product(out, x, blocks, activations, path)
    assert weight.linear(torch.zeros(0, 96)).shape == (0, 77)


@needs_kernel
@pytest.mark.parametrize(("activations", "tolerance"), [("int8", 1e-2), ("int16", 1e-4)])
@pytest.mark.parametrize("kind", KINDS)
def test_integer_products_stay_close_to_the_exact_product(
    kind: str, activations: str, tolerance: float, path: str
) -> None:
    """Rounding each activation to 8 bits of its block's largest costs about 0.5% (norm) on normal activations,
    to 16 bits about 0.002%; from 9 rows on every product is the exact one, except on AVX-512 VNNI, where many
    rows multiply in integers too."""
    blocks, _ = _blocks(kind, cols=576)
    x = torch.randn(40, 576, generator=torch.Generator().manual_seed(8))
    exact, integer = _exact(blocks), _integer(blocks, activations)
    for rows in (1, 8, 9, 40):
        reference = exact.linear(x[:rows])
        assert float((integer.linear(x[:rows]) - reference).norm() / reference.norm()) < tolerance
    if path != "avx512":
        assert torch.equal(integer.linear(x[:9]), exact.linear(x[:9]))


@needs_kernel
def test_auto_keeps_blocks_for_the_kernel_and_int_modes_keep_torchs_forms() -> None:
    blocks, _ = _blocks("Q8_0")
    assert form_for("auto", blocks) == "blocks" and isinstance(quantize_form(blocks, "blocks"), BlockWeight)
    assert form_for("int8", blocks) == "int8" and form_for("int4", blocks) == "int4"
    assert form_for("auto", torch.zeros(4, 32)) == "dense"


def test_a_failed_build_warns_once_and_loads_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def no_compiler(build_dir: Path) -> None:
        raise RuntimeError("Error building extension: c++: command not found")

    monkeypatch.setenv("TIDEGATE_KERNEL_DIR", str(tmp_path))
    monkeypatch.setattr(block_kernel.shutil, "which", lambda name: f"/usr/bin/{name}")  # a compiler, that fails
    monkeypatch.setattr(block_kernel, "_compile", no_compiler)
    with caplog.at_level(logging.WARNING, logger=block_kernel.__name__):
        assert block_kernel._load() is None
    assert "building the CPU kernels once" in caplog.text
    assert "unavailable (Error building extension: c++: command not found)" in caplog.text
    assert list(tmp_path.iterdir()) == [], "a failed build leaves nothing to load"


def test_without_a_compiler_one_warning_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TIDEGATE_KERNEL_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-c++")
    with caplog.at_level(logging.WARNING, logger=block_kernel.__name__):
        assert block_kernel._load() is None
    assert [r.getMessage() for r in caplog.records] == [
        "the CPU kernels are unavailable (no C++ compiler (no-such-c++) on PATH); "
        "quantized matrices use torch's int4/int8 forms, attention SDPA"
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_without_the_kernel_auto_falls_back_to_torchs_forms(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(block_kernel, "load", lambda: None)
    blocks, reference = _blocks(kind, rows=80)  # torch's int4 packing takes out-features in multiples of 16
    form = form_for("auto", blocks)
    weight = quantize_form(blocks, form)
    assert isinstance(weight, Int8Weight if kind in ("Q8_0", "Q5_0") else Int4Weight)
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(0))
    dense = F.linear(x, reference)
    # bfloat16 activations and scales (Q8_0 and Q5_0 also lose their per-block scales): about three significant digits
    assert float((weight.linear(x) - dense).norm() / dense.norm()) < 1e-2



@pytest.fixture(scope="module")
def default_model_in_both_modes(model_path: Path) -> Iterator[tuple[LlamaModel, LlamaModel, Tokenizer]]:
    """The default model under `none` and `auto`, built from one reading of the file (parsing it is most of a load)."""
    with torch_threads(1):  # under a shared CPU, 2-thread OMP barriers cost more than they win
        contents = read_gguf(model_path, keep_blocks=True)
        models = []
        for mode in ("none", "auto"):
            model = LlamaModel(contents.config, rope_freq_factors=contents.rope_freq_factors)
            model.load_weights(contents.weights, mode)
            models.append(model.eval())
        tokenizer = Tokenizer.from_gguf_metadata(contents.metadata, max_context=contents.config.max_position_embeddings)
        yield models[0], models[1], tokenizer


@needs_kernel
def test_default_model_answers_alike_in_auto_and_none(
    default_model_in_both_modes: tuple[LlamaModel, LlamaModel, Tokenizer],
) -> None:
    none, auto, tokenizer = default_model_in_both_modes
    assert isinstance(auto.layers[0].qkv_proj, BlockWeight) and isinstance(none.layers[0].qkv_proj, torch.Tensor)
    for text in engine_fixtures.PROMPTS[:3]:
        prompt = tokenizer.encode(text)
        assert paged_greedy(auto, prompt, 10) == paged_greedy(none, prompt, 10), text
