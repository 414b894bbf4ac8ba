"""The torch elementwise ops give the bits of transformers' formulas in float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backend.executor import elementwise


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
