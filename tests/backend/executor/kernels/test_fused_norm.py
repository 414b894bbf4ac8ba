"""RMSNorm kernels against the model's torch norm ops, alone and fused with the residual add."""

from __future__ import annotations

import pytest
import torch

from backend.executor.cpu import elementwise
from backend.executor.kernels import add_rms_norm, rms_norm

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


EPS = 1e-5


def _norm_weight(hidden: int, dtype: torch.dtype, rng: torch.Generator) -> torch.Tensor:
    return (1.0 + 0.1 * torch.randn(hidden, generator=rng)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("rows", "hidden"), [(1, 64), (5, 576), (3, 1000)])
def test_rms_norm_matches_model_norm(
    dtype: torch.dtype, rows: int, hidden: int, device: torch.device, rng: torch.Generator
) -> None:
    weight = _norm_weight(hidden, dtype, rng)
    x = (3 * torch.randn(rows, hidden, generator=rng)).to(dtype)
    out = rms_norm(x.to(device), weight.to(device), EPS)
    assert out.dtype == dtype and out.shape == x.shape
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.cpu().float(), elementwise.rms_norm(x, weight, EPS).float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_add_rms_norm_returns_the_sum_and_its_norm(
    dtype: torch.dtype, device: torch.device, rng: torch.Generator
) -> None:
    weight = _norm_weight(576, dtype, rng)
    x = torch.randn(2, 4, 576, generator=rng).to(dtype)
    residual = torch.randn(2, 4, 576, generator=rng).to(dtype)
    out, summed = add_rms_norm(x.to(device), residual.to(device), weight.to(device), EPS)
    expected, expected_sum = elementwise.add_rms_norm(x, residual, weight, EPS)
    assert torch.equal(summed.cpu(), expected_sum)  # the residual stream must not drift from the unfused model
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.cpu().float(), expected.float(), atol=tol, rtol=tol)


def test_strided_rows_and_empty_input(device: torch.device, rng: torch.Generator) -> None:
    weight = _norm_weight(64, torch.float32, rng)
    wide = torch.randn(6, 128, generator=rng)
    rows = wide[:, :64]  # every row starts 128 apart
    out = rms_norm(rows.to(device), weight.to(device), EPS)
    torch.testing.assert_close(out.cpu(), elementwise.rms_norm(rows, weight, EPS), atol=1e-5, rtol=1e-5)
    assert rms_norm(torch.empty(0, 64, device=device), weight.to(device), EPS).shape == (0, 64)
