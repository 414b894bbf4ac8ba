"""RMSNorm, alone and fused with the residual add that precedes it in every Llama block."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    stride_x,
    stride_residual,
    stride_out,
    stride_residual_out,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        # Round the sum to the activation dtype first, as the unfused model does, then normalise it.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * stride_residual_out + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, 0) / hidden + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    # Round to the activation dtype before the weight, as the model does; the fp32 product of two 16-bit
    # floats is exact, so rounding it once equals a native 16-bit multiply.
    normed = (xf * inv_rms).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    hidden = x.shape[-1]
    assert weight.shape == (hidden,), f"weight {tuple(weight.shape)} does not match hidden size {hidden}"
    x2 = x.reshape(-1, hidden)
    assert x2.stride(1) == 1, "the hidden axis must be contiguous"
    out = torch.empty_like(x2)
    res2 = residual.reshape(-1, hidden) if residual is not None else x2
    res_out = torch.empty_like(x2) if residual is not None else None
    if x2.shape[0] > 0:
        _rms_norm_kernel[(x2.shape[0],)](
            x2,
            res2,
            weight,
            out,
            res_out if res_out is not None else out,
            x2.stride(0),
            res2.stride(0),
            out.stride(0),
            (res_out if res_out is not None else out).stride(0),
            hidden,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=triton.next_power_of_2(hidden),
        )
    return out.view(x.shape), res_out.view(x.shape) if res_out is not None else None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x**2) + eps)`` over the last axis, computed in fp32."""
    out, _ = _launch(x, None, weight, eps)
    return out


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(rms_norm(x + residual), x + residual)`` from one pass over memory."""
    assert residual.shape == x.shape, f"residual {tuple(residual.shape)} vs x {tuple(x.shape)}"
    out, summed = _launch(x, residual, weight, eps)
    assert summed is not None
    return out, summed
