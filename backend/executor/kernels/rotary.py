"""Rotary position embedding applied to q and k in place, both in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["apply_rotary", "rotate"]


@triton.jit
def _rotate_heads(
    x_ptr, stride_t, stride_h, token, num_heads, cos, sin, half_ok,
    HALF: tl.constexpr, HEADS_PAD: tl.constexpr, HALF_PAD: tl.constexpr, IS_NEOX: tl.constexpr,
):
    heads = tl.arange(0, HEADS_PAD)
    i = tl.arange(0, HALF_PAD)
    if IS_NEOX:
        # rotate_half: element i pairs with element i + rotary_dim / 2.
        first = i
        second = i + HALF
    else:
        # GPT-J style: neighbours (2i, 2i + 1) form a pair.
        first = 2 * i
        second = 2 * i + 1
    base = x_ptr + token.to(tl.int64) * stride_t + heads[:, None] * stride_h
    mask = (heads[:, None] < num_heads) & half_ok[None, :]
    x1 = tl.load(base + first[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + second[None, :], mask=mask, other=0.0).to(tl.float32)
    out1 = x1 * cos[None, :] - x2 * sin[None, :]
    out2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(base + first[None, :], out1.to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(base + second[None, :], out2.to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr, q_ptr, k_ptr, cos_sin_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cache,
    num_q_heads, num_k_heads,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, Q_HEADS_PAD: tl.constexpr, K_HEADS_PAD: tl.constexpr,
    IS_NEOX: tl.constexpr,
):
    token = tl.program_id(0)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    i = tl.arange(0, HALF_PAD)
    half_ok = i < HALF
    cos = tl.load(cos_sin_ptr + pos * stride_cache + i, mask=half_ok, other=1.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cache + HALF + i, mask=half_ok, other=0.0)
    _rotate_heads(q_ptr, stride_qt, stride_qh, token, num_q_heads, cos, sin, half_ok,
                  HALF, Q_HEADS_PAD, HALF_PAD, IS_NEOX)
    _rotate_heads(k_ptr, stride_kt, stride_kh, token, num_k_heads, cos, sin, half_ok,
                  HALF, K_HEADS_PAD, HALF_PAD, IS_NEOX)


def apply_rotary(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    is_neox: bool = True,
) -> None:
    """Rotate q ``[T, heads, head_dim]`` and k ``[T, kv_heads, head_dim]`` in place at ``positions [T]``.

    The first ``rotary_dim`` (the cache's width) features of each head rotate; the rest pass through.
    ``is_neox`` selects Hugging Face's rotate_half pairing; False pairs neighbouring features (GPT-J).
    """
    num_tokens, num_q_heads, head_dim = q.shape
    rotary_dim = cos_sin_cache.shape[1]
    assert k.shape[0] == num_tokens and k.shape[2] == head_dim and positions.shape == (num_tokens,)
    assert rotary_dim % 2 == 0 and rotary_dim <= head_dim, f"rotary_dim {rotary_dim} vs head_dim {head_dim}"
    assert q.stride(2) == 1 and k.stride(2) == 1 and cos_sin_cache.stride(1) == 1
    if num_tokens == 0:
        return
    half = rotary_dim // 2
    _rotary_kernel[(num_tokens,)](
        positions, q, k, cos_sin_cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        num_q_heads, k.shape[1],
        HALF=half,
        HALF_PAD=triton.next_power_of_2(half),
        Q_HEADS_PAD=triton.next_power_of_2(num_q_heads),
        K_HEADS_PAD=triton.next_power_of_2(k.shape[1]),
        IS_NEOX=is_neox,
    )


def rotate(
    positions: torch.Tensor, qk: torch.Tensor, num_q_heads: int, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's rotary op (`backend.executor.model.rotary.RotaryOp`): q and k heads of `qk`, rotated in place."""
    q, k = qk[:, :num_q_heads], qk[:, num_q_heads:]
    apply_rotary(positions, q, k, cos_sin_cache)
    return q, k
