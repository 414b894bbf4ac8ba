"""Paged attention: the interface every implementation follows, and the torch reference.

A step is a flat batch of T new tokens from S sequences (prefill chunks and decodes mixed). The KV cache of
one layer is a pair of tensors `[num_blocks, block_size, num_kv_heads, head_dim]`; a sequence's tokens live in
the blocks its block table names, in order. The new tokens of sequence i are at the END of its context: token
j of its chunk has absolute position `context_len - q_len + j` and attends causally to cache positions up to
that one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class AttentionMetadata:
    """Where each sequence's new tokens are in the batch and where its context is in the cache."""

    query_start_loc: torch.Tensor  # [S+1] int32, cumulative count of new tokens per sequence
    context_lens: torch.Tensor  # [S] int32, cached prefix + new tokens, AFTER this step
    block_tables: torch.Tensor  # [S, max_blocks] int32, padded with 0
    slot_mapping: torch.Tensor  # [T] int64, block_id * block_size + offset per new token; -1 = padding
    max_query_len: int
    max_context_len: int


class AttentionBackend(Protocol):
    """One attention implementation (torch here; Triton kernels implement the same two calls)."""

    def write_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Store new keys/values `[T, kv_heads, head_dim]` at their slots; rows with slot -1 are skipped."""
        ...

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Causal attention of queries `[T, heads, head_dim]` over each sequence's cached context."""
        ...


@dataclass(slots=True)
class _StepPlan:
    """What every layer of one step shares: computed once per metadata object, not once per layer."""

    decode_rows: torch.Tensor | None  # token rows of single-token sequences
    decode_only: bool  # every row of the step is a decode, in order: no gather of queries, no scatter back
    covers_all_rows: bool  # no padded rows, so the output needs no zero fill
    decode_blocks: torch.Tensor  # [Sd * nb] block ids to gather for them
    decode_mask: torch.Tensor  # [Sd, 1, 1, nb * block_size] True where a key is visible
    prefills: list[tuple[int, int, int, torch.Tensor]]  # (start, q_len, ctx_len, blocks) per sequence


class TorchAttention:
    """Reference paged attention with torch ops; fast enough for CPU serving.

    Decodes of all sequences are gathered into one padded batch and computed by one masked
    `scaled_dot_product_attention`; each prefill chunk gets its own call (its cost dwarfs the call overhead).
    What every layer of a step shares is computed once, keyed on the identity of the metadata's tensors: build
    new tensors for each step rather than refilling the previous step's in place.
    """

    def __init__(self) -> None:
        self._plan_key: tuple[torch.Tensor, ...] = ()
        self._plan_block_size = 0
        self._plan: _StepPlan | None = None
        self._slot_source: torch.Tensor | None = None
        self._valid_rows: torch.Tensor | None = None
        self._slots = torch.empty(0, dtype=torch.long)

    def write_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        kvh, d = k_cache.shape[2], k_cache.shape[3]
        flat_k, flat_v = k_cache.view(-1, kvh, d), v_cache.view(-1, kvh, d)
        if slot_mapping is not self._slot_source:  # every layer of a step passes the same tensor
            valid = torch.nonzero(slot_mapping >= 0).squeeze(1)
            padded = valid.numel() != slot_mapping.numel()
            self._slot_source, self._valid_rows = slot_mapping, valid if padded else None
            self._slots = slot_mapping[valid] if padded else slot_mapping
        if self._valid_rows is not None:
            k, v = k.index_select(0, self._valid_rows), v.index_select(0, self._valid_rows)
        flat_k.index_copy_(0, self._slots, k.to(flat_k.dtype))
        flat_v.index_copy_(0, self._slots, v.to(flat_v.dtype))

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        plan = self._plan_for(meta, k_cache.shape[1])
        num_heads, kvh, d = q.shape[1], k_cache.shape[2], k_cache.shape[3]
        group = num_heads // kvh
        if plan.decode_rows is not None:
            sd = plan.decode_rows.numel()
            # All query heads sharing a KV head become that head's "query rows": GQA without copying K/V.
            dq = q if plan.decode_only else q.index_select(0, plan.decode_rows)
            dq = dq.reshape(sd, kvh, group, d)
            keys = _gather(k_cache, plan.decode_blocks).view(sd, -1, kvh, d).transpose(1, 2)
            values = _gather(v_cache, plan.decode_blocks).view(sd, -1, kvh, d).transpose(1, 2)
            res = F.scaled_dot_product_attention(dq, keys, values, attn_mask=plan.decode_mask, scale=scale)
            if plan.decode_only:
                return res.reshape(sd, num_heads, d)
        # Padded rows stay zero rather than garbage.
        out = torch.empty_like(q) if plan.covers_all_rows else torch.zeros_like(q)
        if plan.decode_rows is not None:
            out.index_copy_(0, plan.decode_rows, res.reshape(sd, num_heads, d))
        for start, q_len, ctx_len, blocks in plan.prefills:
            out[start : start + q_len] = _prefill_attention(
                q[start : start + q_len], k_cache, v_cache, blocks, ctx_len, scale, group
            )
        return out

    def _plan_for(self, meta: AttentionMetadata, block_size: int) -> _StepPlan:
        key = (meta.query_start_loc, meta.context_lens, meta.block_tables, meta.slot_mapping)
        same = len(key) == len(self._plan_key) and all(x is y for x, y in zip(key, self._plan_key, strict=True))
        if self._plan is None or not same or block_size != self._plan_block_size:
            self._plan = _make_plan(meta, block_size)
            self._plan_key, self._plan_block_size = key, block_size
        return self._plan


def _make_plan(meta: AttentionMetadata, block_size: int) -> _StepPlan:
    starts = meta.query_start_loc.tolist()
    ctx_lens = meta.context_lens.tolist()
    decodes: list[int] = []
    prefills: list[tuple[int, int, int, torch.Tensor]] = []
    for i, ctx_len in enumerate(ctx_lens):
        start, q_len = starts[i], starts[i + 1] - starts[i]
        if q_len == 0:
            continue
        if q_len == 1:
            decodes.append(i)
            continue
        prefills.append((start, q_len, ctx_len, meta.block_tables[i, : -(-ctx_len // block_size)].long()))

    decode_rows: torch.Tensor | None = None
    decode_blocks = torch.empty(0, dtype=torch.long)
    decode_mask = torch.empty(0, dtype=torch.bool)
    if decodes:
        idx = torch.tensor(decodes, dtype=torch.long)
        decode_rows = torch.tensor([starts[i] for i in decodes], dtype=torch.long)
        lens = meta.context_lens.index_select(0, idx).long()
        nb = -(-int(lens.max()) // block_size)
        decode_blocks = meta.block_tables.index_select(0, idx)[:, :nb].long().reshape(-1)
        decode_mask = (torch.arange(nb * block_size)[None, :] < lens[:, None]).view(len(decodes), 1, 1, -1)
    num_rows = int(meta.slot_mapping.numel())
    covers_all_rows = starts[-1] == num_rows
    decode_only = covers_all_rows and len(decodes) == num_rows  # every row a decode, so rows are in order
    return _StepPlan(decode_rows, decode_only, covers_all_rows, decode_blocks, decode_mask, prefills)


def _prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    blocks: torch.Tensor,
    ctx_len: int,
    scale: float,
    group: int,
) -> torch.Tensor:
    """Attention of one sequence's chunk `[q_len, heads, d]` over its whole context."""
    q_len, _, d = q.shape
    kvh = k_cache.shape[2]
    keys = _gather(k_cache, blocks).view(-1, kvh, d)[:ctx_len].transpose(0, 1)
    values = _gather(v_cache, blocks).view(-1, kvh, d)[:ctx_len].transpose(0, 1)
    mask = None
    if ctx_len > q_len:
        # Query token j sits at absolute position ctx_len - q_len + j and sees keys up to it.
        pos = torch.arange(ctx_len - q_len, ctx_len)
        mask = torch.arange(ctx_len)[None, :] <= pos[:, None]
    res = F.scaled_dot_product_attention(
        q.transpose(0, 1), keys, values, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=group > 1
    )
    return res.transpose(0, 1)


def _gather(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Copy the given blocks out of a cache; via a 2-D view, which torch gathers far faster than a 4-D one."""
    return cache.view(cache.shape[0], -1).index_select(0, blocks)
