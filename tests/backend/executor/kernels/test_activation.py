"""SiLU-and-multiply kernel against silu(gate) * up in torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backend.executor.kernels import silu_and_mul

TOLERANCE = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 2 * 1536), (7, 2 * 100), (2, 3, 2 * 1100)])
def test_matches_torch_silu_times_up(
    dtype: torch.dtype, shape: tuple[int, ...], device: torch.device, rng: torch.Generator
) -> None:
    x = (4 * torch.randn(shape, generator=rng)).to(dtype)
    gate, up = x.chunk(2, dim=-1)
    out = silu_and_mul(x.to(device))
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.cpu().float(), (F.silu(gate.float()) * up.float()), atol=tol, rtol=tol)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # numpy inside the CPU interpreter
def test_large_negative_gates_give_zero_not_nan(device: torch.device) -> None:
    x = torch.tensor([[-1e4, -100.0, 0.0, 100.0, 2.0, 2.0, 2.0, 2.0]], dtype=torch.float16, device=device)
    out = silu_and_mul(x).cpu().float()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.tensor([[-0.0, -0.0, 0.0, 200.0]]), atol=1e-2, rtol=1e-3)


def test_odd_last_axis_is_rejected(device: torch.device) -> None:
    with pytest.raises(AssertionError, match="gate and up"):
        silu_and_mul(torch.zeros(2, 5, device=device))
