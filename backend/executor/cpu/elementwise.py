"""The torch reference of the elementwise ops that the Triton kernels fuse on the GPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square norm, computed in float32 like transformers' LlamaRMSNorm."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        # One fused op instead of seven; it gives the same bits as the formula below for float32.
        return F.rms_norm(x, weight.shape, weight, eps)
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(rms_norm(x + residual), x + residual)`."""
    residual = residual + x
    return rms_norm(residual, weight, eps), residual


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for `gate_up` `[..., 2n]` holding gate then up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)
