"""Which implementation runs each op of the decoder: picked once, when the model is built.

| op set | norms, rotary, SiLU-and-mul | matrix products | attention |
| --- | --- | --- | --- |
| `torch_ops()` | torch | `F.linear` | `TorchAttention` |
| `torch_ops(packed_linear=True)` | torch | oneDNN, weights packed at load (`cpu_linear`) | `TorchAttention` |
| `torch_ops(cpu_kernels=True)` | C++ (`elementwise_kernel`) | as chosen | `TorchAttention` |
| `triton_ops()` | Triton kernels | `F.linear` | `TritonAttention` |

`ops_for(device, dtype)` chooses among them; triton is imported only when `triton_ops` runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from backend.executor.attention.base import AttentionBackend
from backend.executor.attention.torch_attention import TorchAttention
from backend.executor.cpu import cpu_linear, elementwise, elementwise_kernel
from backend.executor.model.rotary import RotaryOp, StepRotation


@dataclass(frozen=True, slots=True)
class ModelOps:
    """The functions every layer calls, and the attention backend (which keeps its buffers across steps)."""

    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    # (x, residual, weight, eps) -> (norm(x + residual), x + residual); it may add x into residual in place
    add_rms_norm: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
    rotary: RotaryOp
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]
    linear: Callable[..., torch.Tensor]  # (x, weight, bias=None), the weight in the form `pack` gave it
    pack: Callable[[torch.Tensor], torch.Tensor] | None  # turns each loaded matrix into that form; None: kept
    attention: AttentionBackend[Any]


def torch_ops(*, packed_linear: bool = False, cpu_kernels: bool = False) -> ModelOps:
    """The torch reference; with `packed_linear`, matrix products through oneDNN (CPU, float32); with
    `cpu_kernels`, the C++ norms, rotation and SiLU-and-mul (CPU, float32, the extension built)."""
    rows = elementwise_kernel if cpu_kernels else elementwise
    return ModelOps(
        rms_norm=rows.rms_norm,
        add_rms_norm=rows.add_rms_norm,
        rotary=elementwise_kernel.rotate if cpu_kernels else StepRotation(),
        silu_and_mul=rows.silu_and_mul,
        linear=cpu_linear.linear if packed_linear else F.linear,
        pack=cpu_linear.pack if packed_linear else None,
        attention=TorchAttention(),
    )


def triton_ops() -> ModelOps:
    """Triton kernels for attention and the elementwise ops (norms with their residual adds, rotary, SiLU)."""
    from backend.executor import kernels
    from backend.executor.attention.triton_attention import TritonAttention

    return ModelOps(
        rms_norm=kernels.rms_norm,
        add_rms_norm=kernels.add_rms_norm,
        rotary=kernels.rotate,
        silu_and_mul=kernels.silu_and_mul,
        linear=F.linear,
        pack=None,
        attention=TritonAttention(),
    )


def ops_for(device: str, dtype: torch.dtype) -> ModelOps:
    """Triton on CUDA; elsewhere torch, and on CPU in float32 packed matrices where torch has oneDNN and the
    C++ row-wise ops where the extension builds."""
    if device.startswith("cuda"):
        return triton_ops()
    cpu_float32 = device == "cpu" and dtype == torch.float32
    return torch_ops(
        packed_linear=cpu_float32 and cpu_linear.available(), cpu_kernels=cpu_float32 and elementwise_kernel.available()
    )
