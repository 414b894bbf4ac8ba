"""The torch elementwise ops give the bits of transformers' formulas in float32; the C++ ones equal them
within float32 rounding."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from backend.executor.cpu import elementwise, elementwise_kernel
from backend.executor.model import rotary
from tests.backend.torch_threads import torch_threads


def llama_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_norms_equal_llama_rms_norm_bit_for_bit(rows: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(rows)
    x, residual = torch.randn(2, rows, 576, generator=gen) * scale
    weight = torch.randn(576, generator=gen)
    assert torch.equal(elementwise.rms_norm(x, weight, 1e-5), llama_rms_norm(x, weight, 1e-5))
    normed, summed = elementwise.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(summed, residual + x) and torch.equal(normed, llama_rms_norm(residual + x, weight, 1e-5))


def test_bfloat16_norm_rounds_where_transformers_does() -> None:
    x, weight = torch.randn(3, 64).bfloat16(), torch.randn(64).bfloat16()
    assert torch.equal(elementwise.rms_norm(x, weight, 1e-6), llama_rms_norm(x, weight, 1e-6))


def test_silu_and_mul_leaves_its_input_alone() -> None:
    gate_up = torch.randn(5, 2 * 96)
    before = gate_up.clone()
    gate, up = before.chunk(2, dim=-1)
    assert torch.equal(elementwise.silu_and_mul(gate_up), F.silu(gate) * up)
    assert torch.equal(gate_up, before)


# The C++ ops (csrc/elementwise.cpp) against the torch reference: decode-sized and prefill-sized row counts, the
# model's hidden size and an odd one (its tail takes the scalar code on the AVX2 path too).
ROWS = [1, 7, 33, 300]
HIDDEN = [576, 67]


def cpp_inputs(rows: int, hidden: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rows * hidden)
    x, residual = torch.randn(2, rows, hidden, generator=gen) * 3
    return x, residual.clone(), torch.randn(hidden, generator=gen)


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", ROWS)
def test_cpp_norms_equal_torch_within_float32_rounding(rows: int, hidden: int, kernel_path: str) -> None:
    x, residual, weight = cpp_inputs(rows, hidden)
    with torch_threads(2):  # 300 rows are enough to be split over threads
        torch.testing.assert_close(
            elementwise_kernel.rms_norm(x, weight, 1e-5), F.rms_norm(x, (hidden,), weight, 1e-5), rtol=1e-6, atol=1e-6
        )
        expected_sum = residual + x
        normed, summed = elementwise_kernel.add_rms_norm(x, residual, weight, 1e-5)
    torch.testing.assert_close(normed, F.rms_norm(expected_sum, (hidden,), weight, 1e-5), rtol=1e-6, atol=1e-6)
    assert summed is residual and torch.equal(residual, expected_sum), "the residual stream advances in place"


def test_cpp_add_rms_norm_leaves_x_alone(kernel_path: str) -> None:
    x, residual, weight = cpp_inputs(3, 576)
    before = x.clone()
    elementwise_kernel.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(x, before)


@pytest.mark.skipif(not elementwise_kernel.available(), reason="the C++ kernel does not build here")
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda x, r, w: (x.double(), r, w), "float32"),
        (lambda x, r, w: (x, r, w[:-1]), "weight"),
        (lambda x, r, w: (x, r[:2], w), "residual"),
        (lambda x, r, w: (x, r.t().contiguous().t(), w), "residual"),
        (lambda x, r, w: (r, r, w), "residual must not be x"),
    ],
    ids=["float64", "short weight", "residual shape", "strided residual", "residual is x"],
)
def test_cpp_norm_refuses_bad_inputs(change: Callable[..., tuple[torch.Tensor, ...]], message: str) -> None:
    x, residual, weight = change(*cpp_inputs(3, 576))
    with pytest.raises(RuntimeError, match=message):
        elementwise_kernel.add_rms_norm(x, residual, weight, 1e-5)


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", ROWS)
def test_cpp_silu_and_mul_equals_torch_within_float32_rounding(rows: int, hidden: int, kernel_path: str) -> None:
    gate_up = torch.randn(rows, 2 * hidden, generator=torch.Generator().manual_seed(rows)) * 4
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # exp's range ends and silu's zero
    before = gate_up.clone()
    with torch_threads(2):
        got = elementwise_kernel.silu_and_mul(gate_up)
    torch.testing.assert_close(got, elementwise.silu_and_mul(before), rtol=1e-6, atol=1e-6)
    assert torch.equal(gate_up, before)


# SmolLM2's heads (9 query, 3 key-value, 64 wide) and an odd shape whose half head (10) the AVX2 path leaves to
# the scalar one.
HEAD_SHAPES = [(9, 3, 64), (3, 1, 20)]


@pytest.mark.parametrize("heads", HEAD_SHAPES, ids=["smollm2", "odd"])
@pytest.mark.parametrize("tokens", ROWS)
def test_cpp_rotation_gives_the_bits_of_the_torch_rotation_in_place(
    tokens: int, heads: tuple[int, int, int], kernel_path: str
) -> None:
    q_heads, kv_heads, dim = heads
    gen = torch.Generator().manual_seed(tokens)
    table = rotary.build_cos_sin_cache(1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim), 512)
    positions = torch.randint(0, 512, (tokens,), generator=gen)
    # q|k as the model hands it over: a strided view of the fused q|k|v rows, whose v must stay untouched.
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * dim, generator=gen)
    qk = qkv[:, : (q_heads + kv_heads) * dim].view(tokens, -1, dim)
    expected, v_before = rotary.rotate(positions, qk, q_heads, table), qkv[:, (q_heads + kv_heads) * dim :].clone()
    with torch_threads(2):
        q, k = elementwise_kernel.rotate(positions, qk, q_heads, table)
    assert torch.equal(q, expected[0]) and torch.equal(k, expected[1])
    assert q.data_ptr() == qk.data_ptr(), "rotated in place"
    assert torch.equal(qkv[:, (q_heads + kv_heads) * dim :], v_before)


@pytest.mark.skipif(not elementwise_kernel.available(), reason="the C++ kernel does not build here")
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: elementwise_kernel.silu_and_mul(torch.randn(2, 7)), "even"),
        (lambda: elementwise_kernel.silu_and_mul(torch.randn(2, 8).double()), "float32"),
        (lambda: elementwise_kernel.rotate(torch.tensor([512]), torch.randn(1, 2, 64), 1, torch.randn(512, 64)),
         "position 512 outside"),
        (lambda: elementwise_kernel.rotate(torch.tensor([-1]), torch.randn(1, 2, 64), 1, torch.randn(512, 64)),
         "position -1 outside"),
        (lambda: elementwise_kernel.rotate(torch.tensor([3], dtype=torch.int32), torch.randn(1, 2, 64), 1,
                                           torch.randn(512, 64)), "int64"),
        (lambda: elementwise_kernel.rotate(torch.tensor([3]), torch.randn(1, 2, 64), 1, torch.randn(512, 32)),
         "table"),
    ],
    ids=["odd gate_up", "float64", "position past the table", "negative position", "int32 positions",
         "narrow table"],
)
def test_cpp_silu_and_rotation_refuse_bad_inputs(call: Callable[[], object], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        call()
