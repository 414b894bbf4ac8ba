"""Rotary position embedding: one cos|sin table by absolute position, and the torch rotation that reads it.

Every path rotates from the same table `[max_positions, head_dim]` (float32, the cos of each position's
angles, then their sin); the Triton kernel (`backend.executor.kernels.apply_rotary`) and the C++ one
(`backend.executor.cpu.elementwise_kernel.rotate`) read it by position. It covers every position the model
accepts, so a step never checks a length on the host, and a CUDA graph can capture it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from backend.executor.model.config import ModelConfig

# (positions [T], qk [T, heads + kv_heads, head_dim], num_q_heads, cos_sin_cache) -> rotated (q, k), which may be
# qk's own heads rotated in place (the C++ and Triton ops do that)
RotaryOp = Callable[[torch.Tensor, torch.Tensor, int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def rope_inv_freq(config: ModelConfig, freq_factors: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse frequencies, with the file's scaling (linear, llama3, or llama.cpp's `rope_freqs` factors)."""
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    inv_freq = 1.0 / (config.rope_theta**exponents)
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    elif kind == "longrope":  # the short factors: the context is capped at the original one (config.py)
        if "short_factor" in scaling:  # a GGUF file gives them as `freq_factors` instead
            inv_freq = inv_freq / torch.tensor(scaling["short_factor"], dtype=torch.float32)
    elif kind is not None:
        raise ValueError(f"unsupported RoPE scaling {kind!r}")
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.float().cpu()
    return inv_freq


def rope_attention_factor(config: ModelConfig) -> float:
    """LongRoPE's scale of cos and sin (1 for every other kind), as transformers computes it."""
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type") != "longrope":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, original = float(scaling["factor"]), float(scaling["original_max_position_embeddings"])
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor, low, high = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def build_cos_sin_cache(inv_freq: torch.Tensor, max_positions: int) -> torch.Tensor:
    """fp32 ``[max_positions, rotary_dim]``: cos of each position's angles, then their sin.

    ``inv_freq`` is ``[rotary_dim // 2]``, already adjusted for any rope scaling.
    """
    positions = torch.arange(max_positions, dtype=torch.float32, device=inv_freq.device)
    angles = torch.outer(positions, inv_freq.to(torch.float32))
    return torch.cat([angles.cos(), angles.sin()], dim=-1).contiguous()


def rotate(
    positions: torch.Tensor, qk: torch.Tensor, num_q_heads: int, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's rotate_half rotation of every head of `qk` at `positions`; returns the q and k heads.

    Q and K heads are rotated together: one set of elementwise ops instead of two.
    """
    return rotate_with(rotation_rows(positions, cos_sin_cache, qk.dtype), qk, num_q_heads)


def rotation_rows(
    positions: torch.Tensor, cos_sin_cache: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(cos|cos, -sin|sin)` `[T, 1, head_dim]` at `positions`: the factors of `x` and of `x` with its halves
    swapped, so that a rotation is two products and a sum."""
    cos, sin = cos_sin_cache.index_select(0, positions).to(dtype).unsqueeze(1).chunk(2, dim=-1)
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def rotate_with(
    rows: tuple[torch.Tensor, torch.Tensor], qk: torch.Tensor, num_q_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rotate` with the factors `rotation_rows` gathered: `x1*cos - x2*sin | x2*cos + x1*sin`, bit for bit."""
    cos, signed_sin = rows
    d = qk.shape[-1]
    swapped = qk.roll(d // 2, dims=-1)  # the halves swapped: a new tensor, so the product below may be in place
    # Not addcmul_: it fuses the multiply and the add, which rounds differently from the reference.
    rotated = torch.mul(qk, cos).add_(swapped.mul_(signed_sin))
    return rotated[:, :num_q_heads], rotated[:, num_q_heads:]


class StepRotation:
    """The torch `RotaryOp` that gathers its factors once per step: every layer of a step passes the same
    positions tensor, so the first layer gathers and the others reuse. A caller that refills one positions
    tensor in place between steps (CUDA graphs do) must use `rotate` instead."""

    __slots__ = ("_key", "_rows")

    def __init__(self) -> None:
        self._key: tuple[torch.Tensor, torch.Tensor, torch.dtype] | None = None
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(
        self, positions: torch.Tensor, qk: torch.Tensor, num_q_heads: int, cos_sin_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        key = self._key
        if key is None or key[0] is not positions or key[1] is not cos_sin_cache or key[2] != qk.dtype:
            # Holding the tensors keeps their identities from being reused by another step's.
            self._key = (positions, cos_sin_cache, qk.dtype)
            self._rows = rotation_rows(positions, cos_sin_cache, qk.dtype)
        assert self._rows is not None
        return rotate_with(self._rows, qk, num_q_heads)


class Rotary(nn.Module):
    """The model's rotary embedding: its table, built once (on the CPU, then moved), and the op that applies it."""

    def __init__(self, config: ModelConfig, op: RotaryOp, freq_factors: torch.Tensor | None = None) -> None:
        super().__init__()
        self.inv_freq = rope_inv_freq(config, freq_factors)
        table = build_cos_sin_cache(self.inv_freq, config.max_position_embeddings) * rope_attention_factor(config)
        self.cos_sin_cache: torch.Tensor
        self.register_buffer("cos_sin_cache", table.to(torch.get_default_device()), persistent=False)
        self.op = op

    def forward(self, positions: torch.Tensor, qk: torch.Tensor, num_q_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """q `[T, num_q_heads, d]` and k `[T, kv_heads, d]` of `qk`, rotated to their positions."""
        return self.op(positions, qk, num_q_heads, self.cos_sin_cache)
