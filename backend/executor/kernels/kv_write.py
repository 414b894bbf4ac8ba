"""Scatter new K and V rows into the paged KV cache by slot mapping."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kv_write_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cache_slot,
    stride_cache_head,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program per (token, KV head): any head count works, not only powers of two.
    token = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return
    d = tl.arange(0, BLOCK_D)
    mask = d < HEAD_DIM
    dst = slot.to(tl.int64) * stride_cache_slot + head * stride_cache_head + d
    k = tl.load(k_ptr + token.to(tl.int64) * stride_kt + head * stride_kh + d, mask=mask)
    v = tl.load(v_ptr + token.to(tl.int64) * stride_vt + head * stride_vh + d, mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write k, v ``[T, kv_heads, head_dim]`` into caches ``[blocks, block_size, kv_heads, head_dim]``.

    Token ``t`` goes to flat slot ``slot_mapping[t]`` (``block_id * block_size + offset``); rows whose
    slot is -1 are padding and are skipped. K and V are cast to the cache dtype.
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert v.shape == k.shape, f"k {tuple(k.shape)} and v {tuple(v.shape)} differ"
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert k_cache.is_contiguous(), "the paged cache must be contiguous"
    assert k_cache.shape[2:] == (num_kv_heads, head_dim), "cache heads or head_dim do not match k"
    assert k.stride(2) == 1 and v.stride(2) == 1, "head_dim must be the innermost, contiguous axis"
    assert slot_mapping.shape == (num_tokens,)
    _kv_write_kernel[(num_tokens, num_kv_heads)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(1),
        k_cache.stride(2),
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
