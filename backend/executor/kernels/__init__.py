"""Triton kernels for the GPU path: paged attention, KV writes, and the fused elementwise ops.

`TritonAttention` implements `backend.attention.AttentionBackend`, so the engine swaps it in for the torch
reference without any other change. On CPU the kernels only run under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import torch

from backend.executor.attention import AttentionMetadata
from backend.executor.kernels.activation import silu_and_mul
from backend.executor.kernels.fused_norm import add_rms_norm, rms_norm
from backend.executor.kernels.kv_write import write_kv
from backend.executor.kernels.paged_attention import paged_attention
from backend.executor.kernels.rotary import apply_rotary, build_cos_sin_cache

__all__ = [
    "TritonAttention",
    "add_rms_norm",
    "apply_rotary",
    "build_cos_sin_cache",
    "paged_attention",
    "rms_norm",
    "silu_and_mul",
    "write_kv",
]


class TritonAttention:
    """Paged attention and KV writes as Triton kernels; one launch each per layer, no host sync."""

    graph_safe = True

    def write_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Store new keys/values ``[T, kv_heads, head_dim]`` at their slots; rows with slot -1 are skipped."""
        write_kv(k, v, k_cache, v_cache, slot_mapping)

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Causal attention of queries ``[T, heads, head_dim]`` over each sequence's cached context."""
        m = meta
        return paged_attention(
            q, k_cache, v_cache, m.query_start_loc, m.context_lens, m.block_tables, m.max_query_len, scale,
            max_context_len=m.max_context_len,
        )

