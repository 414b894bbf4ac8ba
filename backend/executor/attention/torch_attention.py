"""Paged attention with torch ops (the reference), and the C++ decode kernel where it serves (CPU serving)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from backend.executor.attention.base import AttentionMetadata
from backend.executor.cpu import paged_kernel
from backend.executor.cpu.paged_kernel import KernelRows


@dataclass(slots=True)
class _DecodeChunk:
    """Single-token sequences of similar context length, attended together from one gathered buffer."""

    rows: torch.Tensor  # [m] token rows of these sequences in the step
    blocks: torch.Tensor  # [m * n] block ids to gather, n blocks per sequence (the longest one's count)
    first_block: int | None  # one sequence whose blocks are consecutive from this id: read in place, no gather
    length: int  # the longest context; every key up to it is visible when `visible` is None
    visible: torch.Tensor | None  # [m, 1, 1, n * block_size] True where a key is visible, False past a shorter end
    one_thread: bool  # few keys: the second thread gains less than its barrier costs, most of all on a busy machine


@dataclass(slots=True)
class TorchAttentionPlan:
    """What every layer of one step shares, computed once by `TorchAttention.plan`."""

    kernel: KernelRows | None  # the sequences the C++ kernel attends (then `decodes` is empty)
    kernel_slots: torch.Tensor | None  # every row's cache slot (-1: padding) where the C++ kernel writes the cache
    decodes: list[_DecodeChunk]
    covers_all_rows: bool  # no padded rows, so the output needs no zero fill
    decode_only: bool  # one decode chunk holding every row in order: its result is the output as it is
    prefills: list[tuple[int, int, int, torch.Tensor]]  # (start, q_len, ctx_len, blocks) per sequence
    slots: torch.Tensor  # [T'] the cache slot of each real (unpadded) new token
    written_rows: torch.Tensor | None  # [T'] rows of those tokens in the step; None when no row is padding


class TorchAttention:
    """Paged attention with torch ops, and the C++ decode kernel (paged_kernel.py) where it serves.

    Where the kernel serves (a cache on the CPU, the kernel built), every sequence with at most
    `paged_kernel.MAX_QUERY_TOKENS` new tokens goes through it, reading the cache in place; longer prefill
    chunks keep SDPA. Without the kernel, decodes are sorted by context length and cut into chunks of about
    `decode_chunk_tokens` padded keys. Each chunk's blocks are gathered into a reused buffer small enough to
    stay in the CPU cache, so the keys and values come from memory once per layer; sorting keeps the padding
    to the longest context small when lengths are mixed. A 16-bit cache is widened to the queries' dtype where
    SDPA reads it. Each prefill chunk gets its own
    `scaled_dot_product_attention` call (its cost dwarfs the call overhead). A decode chunk of at most
    `one_thread_keys` padded keys runs on one thread, as its plan says.
    """

    graph_safe = False  # plans each step on the host

    def __init__(self, decode_chunk_tokens: int = 4096, one_thread_keys: int = 1024, use_kernel: bool = True) -> None:
        self.decode_chunk_tokens = decode_chunk_tokens
        self.one_thread_keys = one_thread_keys
        self.use_kernel = use_kernel  # False keeps the SDPA path everywhere (tests compare the two)
        if use_kernel:
            paged_kernel.available()  # finds or builds the kernel while the model loads, not in the first step
        self._buffers = [torch.empty(0), torch.empty(0)]  # keys, values

    def plan(self, meta: AttentionMetadata, block_size: int, dtype: torch.dtype) -> TorchAttentionPlan:
        """Split the step into kernel rows or length-sorted decode chunks, and prefill chunks, once for all layers."""
        kernel = self.use_kernel and paged_kernel.serves(meta.context_lens.device, dtype)
        one_thread_keys = self.one_thread_keys if torch.get_num_threads() > 1 else -1
        return _make_plan(meta, block_size, self.decode_chunk_tokens, one_thread_keys, kernel)

    def write_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: TorchAttentionPlan,
    ) -> None:
        if plan.kernel_slots is not None:
            paged_kernel.write_kv(k, v, k_cache, v_cache, plan.kernel_slots)
            return
        kvh, d = k_cache.shape[2], k_cache.shape[3]
        flat_k, flat_v = k_cache.view(-1, kvh, d), v_cache.view(-1, kvh, d)
        if plan.written_rows is not None:
            k, v = k.index_select(0, plan.written_rows), v.index_select(0, plan.written_rows)
        if k.dtype != flat_k.dtype:
            k, v = k.to(flat_k.dtype), v.to(flat_v.dtype)
        flat_k.index_copy_(0, plan.slots, k)
        flat_v.index_copy_(0, plan.slots, v)

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: TorchAttentionPlan,
        scale: float,
    ) -> torch.Tensor:
        if plan.decode_only:
            return self._decode(q, k_cache, v_cache, plan.decodes[0], scale)
        group = q.shape[1] // k_cache.shape[2]
        # Padded rows stay zero rather than garbage.
        out = (torch.empty if plan.covers_all_rows else torch.zeros)(q.shape, dtype=q.dtype, device=q.device)
        if plan.kernel is not None:
            paged_kernel.attend(q, k_cache, v_cache, out, plan.kernel, scale)
        for chunk in plan.decodes:
            out.index_copy_(0, chunk.rows, self._decode(q.index_select(0, chunk.rows), k_cache, v_cache, chunk, scale))
        for start, q_len, ctx_len, blocks in plan.prefills:
            out[start : start + q_len] = _prefill_attention(
                q[start : start + q_len], k_cache, v_cache, blocks, ctx_len, scale, group
            )
        return out

    def _decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, chunk: _DecodeChunk, scale: float
    ) -> torch.Tensor:
        """One chunk of decodes, queries `[m, heads, d]`: one fused attention call over its gathered keys."""
        m, kvh, d = q.shape[0], k_cache.shape[2], k_cache.shape[3]
        if chunk.first_block is not None:
            run = slice(chunk.first_block, chunk.first_block + chunk.blocks.numel())
            keys, values = k_cache[run].view(1, -1, kvh, d), v_cache[run].view(1, -1, kvh, d)
        else:
            keys = self._gather(k_cache, chunk.blocks, 0).view(m, -1, kvh, d)
            values = self._gather(v_cache, chunk.blocks, 1).view(m, -1, kvh, d)
        if chunk.visible is None:
            keys, values = keys[:, : chunk.length], values[:, : chunk.length]
        keys, values = keys.to(q.dtype), values.to(q.dtype)
        if chunk.one_thread:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # the calling thread's OpenMP setting; restored at once
        try:
            # Heads-first views of the gathered [m, n, kvh, d]: the fused kernel reads strides, nothing is copied.
            res = F.scaled_dot_product_attention(
                q.unsqueeze(2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=chunk.visible, scale=scale,
                enable_gqa=kvh != q.shape[1],
            )
        finally:
            if chunk.one_thread:
                torch.set_num_threads(threads)
        return res.reshape(m, -1, d)

    def _gather(self, cache: torch.Tensor, blocks: torch.Tensor, which: int) -> torch.Tensor:
        """Copy blocks out of a cache into a buffer reused across chunks, layers and steps."""
        flat = cache.view(cache.shape[0], -1)
        size = blocks.numel() * flat.shape[1]
        buffer = self._buffers[which]
        if buffer.numel() < size or buffer.dtype != cache.dtype or buffer.device != cache.device:
            buffer = self._buffers[which] = torch.empty(size, dtype=cache.dtype, device=cache.device)
        return torch.index_select(flat, 0, blocks, out=buffer[:size].view(-1, flat.shape[1]))


def _make_plan(
    meta: AttentionMetadata, block_size: int, chunk_tokens: int, one_thread_keys: int,
    kernel: bool,
) -> TorchAttentionPlan:
    starts = meta.query_start_loc.tolist()
    ctx_lens = meta.context_lens.tolist()
    decodes: list[int] = []
    short: list[int] = []
    prefills: list[tuple[int, int, int, torch.Tensor]] = []
    for i, ctx_len in enumerate(ctx_lens):
        start, q_len = starts[i], starts[i + 1] - starts[i]
        if q_len == 0:
            continue
        if kernel and q_len <= paged_kernel.MAX_QUERY_TOKENS:
            short.append(i)
            continue
        if q_len == 1:
            decodes.append(i)
            continue
        prefills.append((start, q_len, ctx_len, meta.block_tables[i, : -(-ctx_len // block_size)].long()))
    rows = None
    if short:
        q_lens = [starts[i + 1] - starts[i] for i in short]
        rows = paged_kernel.rows_for(meta.context_lens, meta.block_tables, short, [starts[i] for i in short], q_lens)
    chunks: list[_DecodeChunk] = []
    first = 0
    if decodes and len(decodes) * _padded(max(ctx_lens[i] for i in decodes), block_size) <= chunk_tokens:
        # One chunk is padded to the longest whatever the order: keep the step's, so rows need no shuffling.
        chunks.append(_decode_chunk(meta, decodes, [starts[i] for i in decodes], block_size, one_thread_keys))
        first = len(decodes)
    decodes.sort(key=lambda i: ctx_lens[i])
    while first < len(decodes):
        # Sorted ascending, so the last sequence taken sets the chunk's padded length.
        end = first + 1
        while end < len(decodes) and (end + 1 - first) * _padded(ctx_lens[decodes[end]], block_size) <= chunk_tokens:
            end += 1
        chunk_rows = [starts[i] for i in decodes[first:end]]
        chunks.append(_decode_chunk(meta, decodes[first:end], chunk_rows, block_size, one_thread_keys))
        first = end
    covers_all_rows = starts[-1] == int(meta.slot_mapping.numel())
    decode_only = covers_all_rows and not prefills and len(decodes) == len(ctx_lens) and len(chunks) == 1
    kernel_slots = meta.slot_mapping if kernel else None
    written = torch.nonzero(meta.slot_mapping >= 0).squeeze(1)
    if written.numel() == meta.slot_mapping.numel():
        return TorchAttentionPlan(
            rows, kernel_slots, chunks, covers_all_rows, decode_only, prefills, meta.slot_mapping, None
        )
    return TorchAttentionPlan(
        rows, kernel_slots, chunks, covers_all_rows, decode_only, prefills, meta.slot_mapping[written], written
    )


def _padded(ctx_len: int, block_size: int) -> int:
    return -(-ctx_len // block_size) * block_size


def _decode_chunk(
    meta: AttentionMetadata, seqs: list[int], rows: list[int], block_size: int, one_thread_keys: int
) -> _DecodeChunk:
    device = meta.context_lens.device
    idx = torch.tensor(seqs, dtype=torch.long, device=device)
    lens = meta.context_lens.index_select(0, idx).long()
    lengths = lens.tolist()
    length = max(lengths)
    nb = -(-length // block_size)
    table = meta.block_tables.index_select(0, idx)[:, :nb].long()
    first_block = None
    if len(seqs) == 1:
        ids = table[0].tolist()
        if ids == list(range(ids[0], ids[0] + nb)):
            first_block = ids[0]
    visible = None
    if min(lengths) != length:
        visible = (torch.arange(nb * block_size, device=device)[None, :] < lens[:, None])[:, None, None]
    rows_t = torch.tensor(rows, dtype=torch.long, device=device)
    keys = len(seqs) * (length if visible is None else nb * block_size)
    return _DecodeChunk(rows_t, table.reshape(-1), first_block, length, visible, keys <= one_thread_keys)


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
    keys = _gather(k_cache, blocks).view(-1, kvh, d)[:ctx_len].transpose(0, 1).to(q.dtype)
    values = _gather(v_cache, blocks).view(-1, kvh, d)[:ctx_len].transpose(0, 1).to(q.dtype)
    mask = None
    if ctx_len > q_len:
        # Query token j sits at absolute position ctx_len - q_len + j and sees keys up to it.
        pos = torch.arange(ctx_len - q_len, ctx_len, device=q.device)
        mask = torch.arange(ctx_len, device=q.device)[None, :] <= pos[:, None]
    # Four dimensions, batch 1: with three, torch's CPU dispatch skips its flash kernel for the math path's
    # bmm and softmax, 2.5x slower at 256 tokens (a sixth of a prefill step).
    res = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], keys[None], values[None], attn_mask=mask, is_causal=mask is None, scale=scale,
        enable_gqa=group > 1,
    )
    return res[0].transpose(0, 1)


def _gather(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Copy the given blocks out of a cache; via a 2-D view, which torch gathers far faster than a 4-D one."""
    return cache.view(cache.shape[0], -1).index_select(0, blocks)
