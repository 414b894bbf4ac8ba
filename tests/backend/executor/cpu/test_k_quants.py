"""The K-quant matrices (Q4_K, Q5_K, Q6_K) kept in the file's super-blocks: the repack moves the file's values and
loses none (the kernel's dequantization equals gguf's bit for bit), and the integer products on every instruction
set path equal the float product of those values within the rounding of the activations (8 bits; 16 for decode
rows)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from backend.executor.cpu import block_kernel, k_quants
from backend.executor.cpu.k_quants import fields, from_k_blocks, repack
from backend.executor.cpu.quant_blocks import BLOCK_BYTES, K_KINDS, BlockQuantized, MixedRows, concat_rows
from backend.loading.k_quantizer import quantize_k

kernel = block_kernel.load()
needs_kernel = pytest.mark.skipif(kernel is None, reason="the block kernel does not build here")
BITS_PER_WEIGHT = {"Q4_K": 4.625, "Q5_K": 5.625, "Q6_K": 6.5625}  # the repacked bytes, rows a multiple of 8
ISAS = ["scalar", "avx2", "avx512"]


def _matrix(kind: str, rows: int = 37, cols: int = 512, seed: int = 0) -> tuple[BlockQuantized, torch.Tensor]:
    """A `kind` matrix (37 rows: not a multiple of any group) from the test quantizer, and gguf's float32 values."""
    w = np.random.default_rng(seed).normal(0, 0.05, (rows, cols)).astype(np.float32)
    raw = quantize_k(w, Q[kind])
    return BlockQuantized(kind, torch.from_numpy(raw), (rows, cols)), torch.from_numpy(dequantize(raw, Q[kind]))


def _random_bytes(kind: str, rows: int = 19, cols: int = 768, seed: int = 1) -> BlockQuantized:
    """Every bit of the quants and the block scales random (so every bit pattern of the packing is exercised);
    the float16 scales fixed to finite values."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(rows, cols // 256, BLOCK_BYTES[kind]), dtype=np.uint8)
    scales = np.array([0.0031, -0.0017], dtype=np.float16).view(np.uint8)
    if kind == "Q6_K":
        data[..., -2:] = scales[:2]
    else:
        data[..., 0:4] = scales
    return BlockQuantized(kind, torch.from_numpy(data.reshape(rows, -1)), (rows, cols))


@pytest.fixture(params=ISAS)
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    assert kernel is not None
    best = kernel.k_isa()
    if ISAS.index(request.param) > ISAS.index(best.split("-")[0]):
        pytest.skip(f"this CPU lacks {request.param}")
    kernel.set_k_isa(request.param)
    yield request.param
    kernel.set_k_isa(best.split("-")[0])


@pytest.mark.parametrize("kind", K_KINDS)
def test_test_quantizer_writes_the_format(kind: str) -> None:
    """The reference quantizer's bytes read back (through gguf) within a step of each block's levels."""
    w = np.random.default_rng(3).normal(0, 0.05, (4, 512)).astype(np.float32)
    back = dequantize(quantize_k(w, Q[kind]), Q[kind])
    levels = {"Q4_K": 15, "Q5_K": 31, "Q6_K": 63}[kind]
    spread = np.ptp(w.reshape(-1, 16), axis=-1).max()
    assert np.abs(back - w).max() <= 1.1 * spread / levels


@pytest.mark.parametrize("kind", K_KINDS)
def test_fields_are_what_gguf_dequantizes(kind: str) -> None:
    weight = _random_bytes(kind)
    q, d, dmin, scales, minimums = fields(weight)
    rows, cols = weight.shape
    if kind == "Q6_K":
        step = d.float()[..., None] * scales.float()
        values = step.repeat_interleave(16, -1) * (q.float() - 32)
    else:
        assert dmin is not None and minimums is not None
        step = (d.float()[..., None] * scales.float()).repeat_interleave(32, -1)
        values = step * q.float() - (dmin.float()[..., None] * minimums.float()).repeat_interleave(32, -1)
    assert torch.equal(values.reshape(rows, cols), weight.dequantize())


@needs_kernel
@pytest.mark.parametrize("kind", K_KINDS)
def test_repack_is_exact(kind: str) -> None:
    assert kernel is not None
    for weight in (_random_bytes(kind), _matrix(kind)[0]):
        reference = torch.from_numpy(dequantize(weight.blocks.numpy(), Q[kind])).reshape(weight.shape)
        packed = from_k_blocks(weight, kernel)
        assert torch.equal(packed.dequantize(), reference)
        ids = torch.tensor([5, 0, weight.shape[0] - 1, 5])
        assert torch.equal(packed.rows(ids, torch.float32), reference[ids])


@pytest.mark.parametrize("kind", K_KINDS)
def test_repacked_size_is_the_files_plus_unpacked_scales(kind: str) -> None:
    weight, _ = _matrix(kind, rows=64, cols=1024)
    assert repack(weight).numel() * 8 / (64 * 1024) == BITS_PER_WEIGHT[kind]


@pytest.mark.parametrize("kind", K_KINDS)
def test_repack_in_slices_is_the_whole_repack(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tall matrix is repacked a slice of rows at a time (its temporaries bounded): the same bytes as at once,
    also where the last slice ends in a partial group of rows."""
    weight = _random_bytes(kind, rows=45)
    whole = repack(weight)
    monkeypatch.setattr(k_quants, "CHUNK_VALUES", 16 * weight.shape[1])
    assert torch.equal(repack(weight), whole)


def _activation_bound(x: torch.Tensor, w: torch.Tensor, levels: int = 127) -> torch.Tensor:
    """How far the integer product may be from the float one: each activation moves at most half its block's step
    (max|x| / levels per 32 values), plus float32 summation."""
    steps = x.abs().view(x.shape[0], -1, 32).amax(-1) / levels
    return 0.5 * steps.repeat_interleave(32, -1) @ w.abs().T * 1.001 + 1e-5 * (x.abs() @ w.abs().T)


@needs_kernel
@pytest.mark.parametrize("kind", K_KINDS)
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 70])
def test_product_is_the_float_product_within_the_activation_rounding(kind: str, rows: int, isa: str) -> None:
    assert kernel is not None
    weight, reference = _matrix(kind, seed=rows)
    x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows))
    out = from_k_blocks(weight, kernel, "int8").linear(x)
    assert out.shape == (rows, weight.shape[0])
    assert bool(((out - x @ reference.T).abs() <= _activation_bound(x, reference)).all())


@needs_kernel
@pytest.mark.parametrize("kind", K_KINDS)
@pytest.mark.parametrize("rows", [1, 5, 8])
def test_decode_rows_at_16_bits_are_256_times_closer(kind: str, rows: int, isa: str) -> None:
    """Decode rows (up to 8) run at 16 bits by default, as two int8 rows: within half a 16-bit step of each
    activation; asked for 8 bits they round as llama.cpp's."""
    assert kernel is not None
    weight, reference = _matrix(kind, seed=rows)
    x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows))
    exact = x @ reference.T
    fine = from_k_blocks(weight, kernel).linear(x)
    coarse = from_k_blocks(weight, kernel, "int8").linear(x)
    assert bool(((fine - exact).abs() <= _activation_bound(x, reference, 127 * 257)).all())
    assert bool(((coarse - exact).abs() <= _activation_bound(x, reference)).all())
    assert float((fine - exact).abs().max()) < float((coarse - exact).abs().max()) / 20


@needs_kernel
@pytest.mark.parametrize("kind", K_KINDS)
@pytest.mark.parametrize(("rows", "activations"), [(40, "int16"), (1, "int16"), (5, "int16"), (3, "int8")])
def test_every_path_computes_the_same_integers(kind: str, rows: int, activations: str) -> None:
    """Scalar, AVX2 and AVX-512 quantize the activations to the same integers (decode rows at 16 bits split in two
    int8 rows, or at 8 bits) and sum the same integer dot products: equal up to float32 summation order."""
    assert kernel is not None
    best = kernel.k_isa().split("-")[0]
    weight = _random_bytes(kind, rows=41)
    packed = from_k_blocks(weight, kernel, activations)
    # 40 rows: AVX-512 takes its two-groups-a-vector path (decode rows take the 256-bit one)
    x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(7))
    outs = []
    for isa in ISAS[: ISAS.index(best) + 1]:
        kernel.set_k_isa(isa)
        outs.append(packed.linear(x))
    kernel.set_k_isa(best)
    bound = 1e-5 * (x.abs() @ weight.dequantize().abs().T) + 1e-6
    for out in outs[1:]:
        assert bool(((out - outs[0]).abs() <= bound).all())


@needs_kernel
@pytest.mark.parametrize("kind", K_KINDS)
@pytest.mark.parametrize("rows", [17, 23, *range(65, 77)])
def test_every_tile_of_the_wide_path_is_the_scalar_product(kind: str, rows: int) -> None:
    """The wide path (more than 16 rows) parts a 64-row chunk in even tiles of up to 12 rows (Q6_K: 8; AVX2: 4)
    and, on AVX-512, packs each tile apart: 65-76 rows end in a chunk of 1-12, 17 and 23 rows run as 9-8 and
    12-11 (Q6_K: 6-6-5 and 8-8-7). Every tile size gives the portable path's integers, up to float32
    summation order."""
    assert kernel is not None
    best = kernel.k_isa().split("-")[0]
    weight = _random_bytes(kind, rows=41)
    packed = from_k_blocks(weight, kernel, "int8")
    x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows))
    kernel.set_k_isa("scalar")
    reference = packed.linear(x)
    kernel.set_k_isa(best)
    bound = 1e-5 * (x.abs() @ weight.dequantize().abs().T) + 1e-6
    assert bool(((packed.linear(x) - reference).abs() <= bound).all())


def test_mixed_kinds_stay_separate_blocks() -> None:
    q, _ = _matrix("Q4_K", rows=16)
    k, _ = _matrix("Q4_K", rows=8, seed=1)
    v, _ = _matrix("Q6_K", rows=8, seed=2)
    merged = concat_rows([q, k, v])
    assert isinstance(merged, MixedRows)
    assert [(p.kind, p.shape[0]) for p in merged.parts] == [("Q4_K", 24), ("Q6_K", 8)]
    assert merged.shape == (32, 512)
    assert torch.equal(merged.dequantize(), torch.cat([q.dequantize(), k.dequantize(), v.dequantize()]))


@needs_kernel
def test_the_environment_caps_the_path() -> None:
    """`TIDEGATE_CPU_ISA` picks a lower path for a whole process (CI forces AVX2 on an AVX-512 runner so)."""
    code = "from backend.executor.cpu import block_kernel; print(block_kernel.load().k_isa())"
    env = {**os.environ, "TIDEGATE_CPU_ISA": "scalar"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=True)
    assert done.stdout.strip() == "scalar"


@needs_kernel
@pytest.mark.parametrize("shape", [(1000, 1000), (3 << 20, 1), (1 << 20, 5)])
def test_huge_page_zeros_are_zeros_that_hold_what_is_written(shape: tuple[int, int]) -> None:
    """Weights are written into memory on 2 MB pages where the system grants them (below 2 MB, torch's zeros):
    zeroed, contiguous, and valid for the tensor's lifetime."""
    assert kernel is not None
    out = kernel.huge_page_zeros(list(shape))
    assert out.shape == shape and out.dtype == torch.uint8 and out.is_contiguous()
    assert not out.any()
    source = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    out.copy_(source)
    del source
    assert int(out.sum(dtype=torch.int64)) == int(out.clone().sum(dtype=torch.int64)) > 0


@needs_kernel
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_a_repack_into_huge_pages_gives_the_bytes_of_a_plain_one(kind: str) -> None:
    assert kernel is not None
    weight = _random_bytes(kind, rows=8197)  # over 2 MB, several slices, a partial last group
    assert torch.equal(repack(weight, kernel.huge_page_zeros), repack(weight))
