"""Paged attention: the per-step metadata the runner builds and the interface every implementation follows.

A step is a flat batch of T new tokens from S sequences (prefill chunks and decodes mixed). The KV cache of
one layer is a pair of tensors `[num_blocks, block_size, num_kv_heads, head_dim]`; a sequence's tokens live in
the blocks its block table names, in order. The new tokens of sequence i are at the END of its context: token
j of its chunk has absolute position `context_len - q_len + j` and attends causally to cache positions up to
that one.

Implementations: `backend/executor/attention/torch_attention.py` (the reference; CPU serving) and
`backend/executor/attention/triton_attention.py` (GPU kernels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Where each sequence's new tokens are in the batch and where its context is in the cache."""

    query_start_loc: torch.Tensor  # [S+1] int32, cumulative count of new tokens per sequence
    context_lens: torch.Tensor  # [S] int32, cached prefix + new tokens, AFTER this step
    block_tables: torch.Tensor  # [S, max_blocks] int32, padded with 0
    slot_mapping: torch.Tensor  # [T] int64, block_id * block_size + offset per new token; -1 = padding
    max_query_len: int
    max_context_len: int


PlanT = TypeVar("PlanT")


class AttentionBackend(Protocol[PlanT]):
    """One attention implementation. The runner calls `plan` once per step; every layer of that step then
    hands the same plan to `write_kv` and `attend`, so whatever the layers share is computed once."""

    # True when a step never reads metadata back to the host, so it can be captured in a CUDA graph.
    graph_safe: bool

    def plan(self, meta: AttentionMetadata, block_size: int, dtype: torch.dtype) -> PlanT:
        """This step's plan, for a KV cache of `block_size`-token blocks holding `dtype`."""
        ...

    def write_kv(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: PlanT
    ) -> None:
        """Store new keys/values `[T, kv_heads, head_dim]` at their slots; rows with slot -1 are skipped."""
        ...

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: PlanT, scale: float
    ) -> torch.Tensor:
        """Causal attention of queries `[T, heads, head_dim]` over each sequence's cached context."""
        ...
