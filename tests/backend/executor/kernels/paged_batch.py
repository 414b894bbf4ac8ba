"""Random paged batches for the attention tests, with a dense per-sequence reference to check against."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.executor.attention.base import AttentionMetadata


@dataclass(slots=True)
class SeqSpec:
    """One sequence of a step: ``q_len`` new tokens at the end of a ``context_len``-token context."""

    q_len: int
    context_len: int
    shares_prefix_with: int | None = None  # index of an earlier sequence whose full blocks it reuses


@dataclass(slots=True)
class PagedBatch:
    q: torch.Tensor  # [T, heads, head_dim]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    meta: AttentionMetadata
    keys: list[torch.Tensor]  # per sequence, dense [context_len, kv_heads, head_dim]
    values: list[torch.Tensor]
    specs: list[SeqSpec]
    num_padded_rows: int


def make_batch(
    specs: list[SeqSpec],
    *,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    rng: torch.Generator,
    block_size: int = 16,
    num_padded_rows: int = 0,
    spare_blocks: int = 7,
) -> PagedBatch:
    """Fill a paged cache whose blocks are scattered in random order; shared prefixes reuse blocks."""
    need = sum(-(-s.context_len // block_size) for s in specs) + spare_blocks
    order = torch.randperm(need, generator=rng).tolist()
    shape = (need, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=rng).to(dtype)  # junk everywhere not owned by a sequence
    v_cache = torch.randn(shape, generator=rng).to(dtype)
    max_blocks = max((-(-s.context_len // block_size) for s in specs), default=1)
    tables = torch.zeros(len(specs), max_blocks, dtype=torch.int32)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    for i, spec in enumerate(specs):
        n_blocks = -(-spec.context_len // block_size)
        shared = 0
        if spec.shares_prefix_with is not None:
            other = spec.shares_prefix_with
            # Only full blocks before this step's new tokens are shareable, as with prefix caching.
            shared = min(specs[other].context_len, spec.context_len - spec.q_len) // block_size
            tables[i, :shared] = tables[other, :shared]
        for b in range(shared, n_blocks):
            tables[i, b] = order.pop()
        blocks = tables[i, :n_blocks].long()
        fresh_k = torch.randn(n_blocks * block_size, num_kv_heads, head_dim, generator=rng).to(dtype)
        fresh_v = torch.randn(n_blocks * block_size, num_kv_heads, head_dim, generator=rng).to(dtype)
        for b in range(shared, n_blocks):
            k_cache[blocks[b]] = fresh_k[b * block_size : (b + 1) * block_size]
            v_cache[blocks[b]] = fresh_v[b * block_size : (b + 1) * block_size]
        keys.append(k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[: spec.context_len].clone())
        values.append(v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[: spec.context_len].clone())
    starts = [0]
    for spec in specs:
        starts.append(starts[-1] + spec.q_len)
    total = starts[-1] + num_padded_rows
    slots = torch.full((total,), -1, dtype=torch.int64)
    for i, spec in enumerate(specs):
        pos = torch.arange(spec.context_len - spec.q_len, spec.context_len)
        slots[starts[i] : starts[i + 1]] = tables[i].long()[pos // block_size] * block_size + pos % block_size
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        context_lens=torch.tensor([s.context_len for s in specs], dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        slot_mapping=slots.to(device),
        max_query_len=max((s.q_len for s in specs), default=0),
        max_context_len=max((s.context_len for s in specs), default=0),
    )
    q = torch.randn(total, num_kv_heads * group, head_dim, generator=rng).to(dtype)
    return PagedBatch(
        q.to(device), k_cache.to(device), v_cache.to(device), meta, keys, values, specs, num_padded_rows
    )


def dense_attention(batch: PagedBatch, scale: float) -> torch.Tensor:
    """fp32 causal attention per sequence over its dense K/V, padded rows zero: the oracle."""
    out = torch.zeros(batch.q.shape, dtype=torch.float32)
    q_all = batch.q.float().cpu()
    start = 0
    for spec, k, v in zip(batch.specs, batch.keys, batch.values, strict=True):
        group = q_all.shape[1] // k.shape[1]
        q = q_all[start : start + spec.q_len]
        kr = k.float().repeat_interleave(group, dim=1)
        vr = v.float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, kr) * scale
        q_pos = torch.arange(spec.context_len - spec.q_len, spec.context_len)[:, None]
        scores = scores.masked_fill(torch.arange(spec.context_len)[None, :] > q_pos, float("-inf"))
        out[start : start + spec.q_len] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vr)
        start += spec.q_len
    return out
