"""RMSNorm kernels against the model's torch RMSNorm, alone and fused with the residual add."""

from __future__ import annotations

import pytest
import torch

from backend.executor.kernels import add_rms_norm, rms_norm
from backend.executor.model import RMSNorm

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _reference_norm(hidden: int, dtype: torch.dtype, rng: torch.Generator) -> RMSNorm:
    norm = RMSNorm(hidden, 1e-5, dtype)
    norm.weight.data = (1.0 + 0.1 * torch.randn(hidden, generator=rng)).to(dtype)
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("rows", "hidden"), [(1, 64), (5, 576), (3, 1000)])
def test_rms_norm_matches_model_norm(
    dtype: torch.dtype, rows: int, hidden: int, device: torch.device, rng: torch.Generator
) -> None:
    norm = _reference_norm(hidden, dtype, rng)
    x = (3 * torch.randn(rows, hidden, generator=rng)).to(dtype)
    out = rms_norm(x.to(device), norm.weight.to(device), norm.eps)
    assert out.dtype == dtype and out.shape == x.shape
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.cpu().float(), norm(x).float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_add_rms_norm_returns_the_sum_and_its_norm(
    dtype: torch.dtype, device: torch.device, rng: torch.Generator
) -> None:
    norm = _reference_norm(576, dtype, rng)
    x = torch.randn(2, 4, 576, generator=rng).to(dtype)
    residual = torch.randn(2, 4, 576, generator=rng).to(dtype)
    out, summed = add_rms_norm(x.to(device), residual.to(device), norm.weight.to(device), norm.eps)
    assert torch.equal(summed.cpu(), x + residual)  # the residual stream must not drift from the unfused model
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.cpu().float(), norm(x + residual).float(), atol=tol, rtol=tol)


def test_strided_rows_and_empty_input(device: torch.device, rng: torch.Generator) -> None:
    norm = _reference_norm(64, torch.float32, rng)
    wide = torch.randn(6, 128, generator=rng)
    rows = wide[:, :64]  # every row starts 128 apart
    out = rms_norm(rows.to(device), norm.weight.to(device), norm.eps)
    torch.testing.assert_close(out.cpu(), norm(rows), atol=1e-5, rtol=1e-5)
    assert rms_norm(torch.empty(0, 64, device=device), norm.weight.to(device), 1e-5).shape == (0, 64)
