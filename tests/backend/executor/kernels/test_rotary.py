"""Rotary kernel against Hugging Face's rotate_half rotation, a GPT-J style reference, and the torch op."""

from __future__ import annotations

import pytest
import torch

from backend.executor import kernels
from backend.executor.kernels import apply_rotary
from backend.executor.model import rotary
from backend.executor.model.rotary import build_cos_sin_cache

TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _inv_freq(rotary_dim: int) -> torch.Tensor:
    return 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))


def _rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _neox_reference(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    angles = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    rot = inv_freq.shape[0] * 2
    out = x.float().clone()
    out[..., :rot] = _rotate_half(x.float()[..., :rot], emb.cos()[:, None, :], emb.sin()[:, None, :])
    return out


def _gptj_reference(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    angles = positions.float()[:, None, None] * inv_freq[None, None, :]
    even, odd = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.empty(x.shape)
    out[..., 0::2] = even * angles.cos() - odd * angles.sin()
    out[..., 1::2] = odd * angles.cos() + even * angles.sin()
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (8, 1, 128), (4, 4, 64)])
def test_neox_rotation_matches_model(
    dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, device: torch.device, rng: torch.Generator
) -> None:
    positions = torch.randint(0, 300, (11,), generator=rng)
    q = torch.randn(11, heads, head_dim, generator=rng).to(dtype)
    k = torch.randn(11, kv_heads, head_dim, generator=rng).to(dtype)
    inv_freq = _inv_freq(head_dim)
    cache = build_cos_sin_cache(inv_freq, 512).to(device)
    q_dev, k_dev = q.clone().to(device), k.clone().to(device)  # rotated in place
    apply_rotary(positions.to(device), q_dev, k_dev, cache)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(q_dev.cpu().float(), _neox_reference(q, positions, inv_freq), atol=tol, rtol=tol)
    torch.testing.assert_close(k_dev.cpu().float(), _neox_reference(k, positions, inv_freq), atol=tol, rtol=tol)


def test_gptj_pairing_and_partial_rotary_dim(device: torch.device, rng: torch.Generator) -> None:
    positions = torch.tensor([0, 1, 17, 299])
    q = torch.randn(4, 3, 64, generator=rng)
    k = torch.randn(4, 1, 64, generator=rng)
    inv_freq = _inv_freq(64)
    q_dev, k_dev = q.clone().to(device), k.clone().to(device)  # rotated in place
    apply_rotary(positions.to(device), q_dev, k_dev, build_cos_sin_cache(inv_freq, 300).to(device), is_neox=False)
    torch.testing.assert_close(q_dev.cpu(), _gptj_reference(q, positions, inv_freq), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_dev.cpu(), _gptj_reference(k, positions, inv_freq), atol=1e-5, rtol=1e-5)

    # Only the first 32 features rotate; the rest pass through untouched.
    partial = _inv_freq(32)
    q2 = q.clone().to(device)
    k2 = k.clone().to(device)
    apply_rotary(positions.to(device), q2, k2, build_cos_sin_cache(partial, 300).to(device))
    torch.testing.assert_close(q2.cpu(), _neox_reference(q, positions, partial), atol=1e-5, rtol=1e-5)
    assert torch.equal(q2.cpu()[..., 32:], q[..., 32:])


def test_strided_q_and_k_views_rotate_in_place(device: torch.device, rng: torch.Generator) -> None:
    # q and k as views into one fused projection: the kernel must honour their row strides.
    qkv = torch.randn(5, (4 + 2) * 64, generator=rng).to(device)
    original = qkv.clone().cpu()
    q = qkv[:, : 4 * 64].view(5, 4, 64)
    k = qkv[:, 4 * 64 : 5 * 64].view(5, 1, 64)
    positions = torch.arange(5)
    apply_rotary(positions.to(device), q, k, build_cos_sin_cache(_inv_freq(64), 8).to(device))
    expected_q = _neox_reference(original[:, : 4 * 64].view(5, 4, 64), positions, _inv_freq(64))
    torch.testing.assert_close(qkv.cpu()[:, : 4 * 64].view(5, 4, 64), expected_q, atol=1e-5, rtol=1e-5)
    assert torch.equal(qkv.cpu()[:, 5 * 64 :], original[:, 5 * 64 :])  # v untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_and_torch_rotary_ops_agree_on_one_table(
    dtype: torch.dtype, device: torch.device, rng: torch.Generator
) -> None:
    # The model's rotary op on either path: the q and k heads of one projection, rotated from one table.
    heads, kv_heads, head_dim = 6, 2, 64
    positions = torch.randint(0, 500, (9,), generator=rng)
    qk = torch.randn(9, heads + kv_heads, head_dim, generator=rng).to(dtype)
    table = build_cos_sin_cache(_inv_freq(head_dim), 512)
    expected_q, expected_k = rotary.rotate(positions, qk, heads, table)
    got_q, got_k = kernels.rotate(positions.to(device), qk.clone().to(device), heads, table.to(device))
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got_q.cpu(), expected_q, atol=tol, rtol=tol)
    torch.testing.assert_close(got_k.cpu(), expected_k, atol=tol, rtol=tol)
