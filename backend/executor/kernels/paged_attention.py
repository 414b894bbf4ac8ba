"""Paged attention over a flat batch that mixes prefill chunks (with cached prefixes) and decodes.

A program owns one tile of one sequence's new tokens for one KV head. The tile packs ``BLOCK_Q`` tokens
times all query heads of that KV head's group into the rows of one matrix, so grouped-query attention
reads every K and V block once per group instead of once per query head. Decode-only steps with few
(sequence, KV head) pairs also split each context across programs (flash-decoding) and merge the partial
softmaxes in a second kernel, so a batch of one still spreads over the GPU.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

# The smallest row count tl.dot accepts on NVIDIA tensor cores.
_MIN_ROWS = 16
# Rows per tile when prefill chunks are present: a wider tile reuses each K/V block for more queries.
_PREFILL_ROWS = 64
_BLOCK_N = 32
_LOG2E = 1.0 / math.log(2.0)
# Split decode contexts until about this many programs run (two waves on a 132-SM Hopper) ...
_TARGET_PROGRAMS = 256
# ... but give every split at least this many keys, and never more than this many splits.
_MIN_SPLIT_KEYS = 64
_MAX_SPLITS = 16


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    partial_acc_ptr,
    partial_ml_ptr,
    query_start_loc_ptr,
    context_lens_ptr,
    block_tables_ptr,
    scale_log2,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    stride_table,
    block_size,
    num_seqs,
    split_keys,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
    SPLIT_KV: tl.constexpr,
):
    # Axis 0 walks query tiles, or with SPLIT_KV (decodes: one tile) slices of the context.
    tile = 0 if SPLIT_KV else tl.program_id(0)
    seq = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if tile * BLOCK_Q >= q_len:
        return
    context_len = tl.load(context_lens_ptr + seq)
    # The new tokens sit at the end of the context: token j is at absolute position prefix_len + j.
    prefix_len = context_len - q_len

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    token = tile * BLOCK_Q + rows // GROUP_PAD
    head = kv_head * GROUP + rows % GROUP_PAD
    row_ok = (token < q_len) & (rows % GROUP_PAD < GROUP)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_rows = (q_start + token).to(tl.int64) * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    q = q.to(tl.float32 if DOT_FP32 else k_cache_ptr.dtype.element_ty)
    q_pos = prefix_len + token

    # A finite floor keeps exp2(m_old - m_new) well defined while a row has seen only masked keys.
    m_i = tl.full([BLOCK_Q * GROUP_PAD], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, BLOCK_D], dtype=tl.float32)
    # Keys past the tile's last query are never visible to it.
    kv_start = 0
    kv_end = prefix_len + tl.minimum(q_len, (tile + 1) * BLOCK_Q)
    if SPLIT_KV:
        kv_start = tl.program_id(0) * split_keys
        kv_end = tl.minimum(kv_end, kv_start + split_keys)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_table
    for start in range(kv_start, kv_end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_ok = pos < kv_end
        block = tl.load(table_row + pos // block_size, mask=pos_ok, other=0).to(tl.int64)
        slot = block * stride_cache_block + (pos % block_size) * stride_cache_slot
        kv_offs = slot[:, None] + kv_head * stride_cache_head + d[None, :]
        kv_mask = pos_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        visible = (pos[None, :] <= q_pos[:, None]) & pos_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
        if DOT_FP32:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    if SPLIT_KV:
        # Unnormalised partial state per (split, sequence, head); the merge kernel finishes the softmax.
        part = (tl.program_id(0) * num_seqs + seq).to(tl.int64) * (GROUP * tl.num_programs(2)) + head
        ok = row_ok & (token == 0)
        tl.store(partial_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=ok[:, None] & d_ok[None, :])
        tl.store(partial_ml_ptr + 2 * part, m_i, mask=ok)
        tl.store(partial_ml_ptr + 2 * part + 1, l_i, mask=ok)
    else:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        o_rows = (q_start + token).to(tl.int64) * stride_ot + head * stride_oh
        tl.store(
            out_ptr + o_rows[:, None] + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )


@triton.jit
def _merge_splits_kernel(
    out_ptr,
    partial_acc_ptr,
    partial_ml_ptr,
    query_start_loc_ptr,
    stride_ot,
    stride_oh,
    num_seqs,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_start = tl.load(query_start_loc_ptr + seq)
    if tl.load(query_start_loc_ptr + seq + 1) == q_start:
        return
    splits = tl.arange(0, SPLITS_PAD)
    split_ok = splits < num_splits
    part = (splits * num_seqs + seq).to(tl.int64) * tl.num_programs(1) + head
    m = tl.load(partial_ml_ptr + 2 * part, mask=split_ok, other=-1.0e30)
    l_part = tl.load(partial_ml_ptr + 2 * part + 1, mask=split_ok, other=0.0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    acc_mask = split_ok[:, None] & d_ok[None, :]
    acc = tl.load(partial_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=acc_mask, other=0.0)
    # Splits past the context kept m at the floor and l at 0, so their weight is exactly 0.
    weight = tl.exp2(m - tl.max(m, 0))
    total = tl.sum(weight * l_part, 0)
    out = tl.sum(weight[:, None] * acc, 0) / tl.where(total > 0.0, total, 1.0)
    o_row = q_start.to(tl.int64) * stride_ot + head * stride_oh
    tl.store(out_ptr + o_row + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


def decode_splits(num_seqs: int, num_kv_heads: int, max_context_len: int) -> int:
    """How many slices to cut each context into for a decode-only step (1 = no split)."""
    by_parallelism = _TARGET_PROGRAMS // max(1, num_seqs * num_kv_heads)
    by_length = triton.cdiv(max_context_len, _MIN_SPLIT_KEYS)
    return max(1, min(by_parallelism, by_length, _MAX_SPLITS))


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_query_len: int,
    scale: float,
    *,
    max_context_len: int | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Causal attention of q ``[T, heads, head_dim]`` over the paged caches; returns ``[T, heads, head_dim]``.

    Sequence ``i`` owns rows ``query_start_loc[i]:query_start_loc[i+1]`` of q, and its keys are the first
    ``context_lens[i]`` cache positions named by ``block_tables[i]``. Rows not owned by any sequence
    (padding) come back as zeros. A decode-only step (``max_query_len == 1``) whose ``max_context_len`` is
    given is split across programs as `decode_splits` decides, unless ``num_splits`` says how many.
    """
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    assert cache_head_dim == head_dim, "q and cache head_dim differ"
    assert num_heads % num_kv_heads == 0, f"{num_heads} query heads over {num_kv_heads} KV heads"
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape == v_cache.shape
    assert q.stride(2) == 1, "head_dim must be the innermost, contiguous axis"
    out = torch.zeros_like(q)
    num_seqs = context_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0 or max_query_len == 0:
        return out
    if num_splits is None:
        num_splits = 1
        if max_query_len == 1 and max_context_len is not None:
            num_splits = decode_splits(num_seqs, num_kv_heads, max_context_len)
    assert num_splits == 1 or max_query_len == 1, "only decode-only steps split their contexts"
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    rows = _MIN_ROWS if max_query_len == 1 else _PREFILL_ROWS
    block_q = max(1, rows // group_pad)
    # fp32 caches keep full fp32 products; tf32 would cost about three decimal digits.
    precision = "ieee" if k_cache.dtype == torch.float32 else "tf32"
    # The CPU interpreter multiplies bf16 as raw integers (numpy has no bf16), so it upcasts there.
    dot_fp32 = k_cache.dtype == torch.bfloat16 and k_cache.device.type == "cpu"
    split_keys = 0
    partial_acc = partial_ml = out  # unused unless split
    if num_splits > 1:
        longest = max_context_len if max_context_len is not None else int(context_lens.max())
        split_keys = triton.cdiv(triton.cdiv(longest, num_splits), _BLOCK_N) * _BLOCK_N
        partial_acc = torch.empty(num_splits, num_seqs, num_heads, head_dim, dtype=torch.float32, device=q.device)
        partial_ml = torch.empty(num_splits, num_seqs, num_heads, 2, dtype=torch.float32, device=q.device)
    grid = (num_splits if num_splits > 1 else triton.cdiv(max_query_len, block_q), num_seqs, num_kv_heads)
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        partial_acc,
        partial_ml,
        query_start_loc,
        context_lens,
        block_tables,
        scale * _LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        block_size,
        num_seqs,
        split_keys,
        GROUP=group,
        GROUP_PAD=group_pad,
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_Q=block_q,
        BLOCK_N=_BLOCK_N,
        PRECISION=precision,
        DOT_FP32=dot_fp32,
        SPLIT_KV=num_splits > 1,
    )
    if num_splits > 1:
        _merge_splits_kernel[(num_seqs, num_heads)](
            out,
            partial_acc,
            partial_ml,
            query_start_loc,
            out.stride(0),
            out.stride(1),
            num_seqs,
            num_splits,
            HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim),
            SPLITS_PAD=triton.next_power_of_2(num_splits),
        )
    return out
