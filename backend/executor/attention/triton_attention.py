"""Paged attention and KV writes as Triton kernels (GPU; the CPU interpreter in tests)."""

from __future__ import annotations

import torch

from backend.executor.attention.base import AttentionMetadata
from backend.executor.kernels.kv_write import write_kv
from backend.executor.kernels.paged_attention import paged_attention


class TritonAttention:
    """One launch each per layer and no host sync, so decode steps can be captured as CUDA graphs.

    The kernels read the runner's metadata as it is: the plan is the metadata itself.
    """

    graph_safe = True

    def plan(self, meta: AttentionMetadata, block_size: int, dtype: torch.dtype) -> AttentionMetadata:
        return meta

    def write_kv(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionMetadata
    ) -> None:
        write_kv(k, v, k_cache, v_cache, plan.slot_mapping)

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        m = plan
        return paged_attention(
            q, k_cache, v_cache, m.query_start_loc, m.context_lens, m.block_tables, m.max_query_len, scale,
            max_context_len=m.max_context_len,
        )
