"""The C++ row-wise ops of a decoder layer (csrc/elementwise.cpp) for float32 on the CPU: each is one call
where torch's ops are several small ones, and a decode step's rows are so small that the calls are the cost.

They are built into the same extension as the block kernel (block_kernel.py) and registered as
`torch.ops.tidegate.*`; `ops.ops_for` picks them for float32 models on the CPU where the extension loads, and
the torch ops of elementwise.py serve everywhere else. They equal those to within float32 rounding.
"""

from __future__ import annotations

import functools

import torch

from backend.executor.cpu import block_kernel


@functools.cache
def available() -> bool:
    """Whether the extension built with these ops (where the block kernel cannot build, neither can they)."""
    return block_kernel.has_op("add_rms_norm")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square norm of each row of `x` (its last axis)."""
    out: torch.Tensor = torch.ops.tidegate.rms_norm(x, weight, eps)
    return out


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(rms_norm(x + residual), residual)` after `residual += x` in place: the residual stream is the caller's
    own tensor, which each layer's norms advance, so no new one is allocated per norm."""
    out: torch.Tensor = torch.ops.tidegate.add_rms_norm(x, residual, weight, eps)
    return out, residual


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for `gate_up` `[..., 2n]` holding gate then up."""
    out: torch.Tensor = torch.ops.tidegate.silu_and_mul(gate_up)
    return out


def rotate(
    positions: torch.Tensor, qk: torch.Tensor, num_q_heads: int, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's `RotaryOp`: the q and k heads of `qk`, rotated in place, with the bits of `rotary.rotate`; each
    token's factors are read from the table at its position, so nothing is gathered per step."""
    torch.ops.tidegate.rotate_(qk, positions, cos_sin_cache)
    return qk[:, :num_q_heads], qk[:, num_q_heads:]
