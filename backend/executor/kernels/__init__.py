"""Triton kernels for the GPU path: paged attention, KV writes, and the fused elementwise ops.

`backend/executor/attention/triton_attention.py` builds the attention backend from the first two, and
`backend.executor.model.ops.triton_ops` picks the rest for the model. On CPU the kernels only run under
``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

from backend.executor.kernels.activation import silu_and_mul
from backend.executor.kernels.fused_norm import add_rms_norm, rms_norm
from backend.executor.kernels.kv_write import write_kv
from backend.executor.kernels.paged_attention import paged_attention
from backend.executor.kernels.rotary import apply_rotary, rotate

__all__ = [
    "add_rms_norm",
    "apply_rotary",
    "paged_attention",
    "rms_norm",
    "rotate",
    "silu_and_mul",
    "write_kv",
]
