"""The Llama-family decoder (Llama, SmolLM2, Qwen2) in plain torch, over a paged KV cache.

Weights arrive under Hugging Face names (`model.layers.0.self_attn.q_proj.weight` ...) and are merged on load:
Q, K and V into one matrix, gate and up into another, so a layer costs four matrix multiplies.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from backend.executor import cpu_linear
from backend.executor.attention import AttentionBackend, AttentionMetadata, TorchAttention
from backend.executor.model_config import ModelConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 like transformers' LlamaRMSNorm."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables by absolute position, grown on demand."""

    def __init__(self, config: ModelConfig, freq_factors: torch.Tensor | None = None) -> None:
        super().__init__()
        self.inv_freq = rope_inv_freq(config, freq_factors)
        self._cos = torch.empty(0)
        self._sin = torch.empty(0)
        self._grow(min(config.max_position_embeddings, 4096))

    def _grow(self, length: int) -> None:
        freqs = torch.arange(length, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        device = self._cos.device
        self._cos, self._sin = emb.cos().to(device), emb.sin().to(device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin `[T, 1, head_dim]` for the given positions."""
        if positions.numel() and int(positions.max()) >= self._cos.shape[0]:
            self._grow(2 * int(positions.max()) + 1)
        if self._cos.device != positions.device:
            self._cos, self._sin = self._cos.to(positions.device), self._sin.to(positions.device)
        cos = self._cos.index_select(0, positions).to(dtype)
        sin = self._sin.index_select(0, positions).to(dtype)
        return cos.unsqueeze(1), sin.unsqueeze(1)


def rope_inv_freq(config: ModelConfig, freq_factors: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse frequencies, with the file's scaling (linear, llama3, or llama.cpp's `rope_freqs` factors)."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    elif kind is not None:
        raise ValueError(f"unsupported RoPE scaling {kind!r}")
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.float()
    return inv_freq


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor, low, high = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def _add_norm(
    x: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm, kernels: ModuleType | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(norm(x + residual), x + residual)`: a block's input and the residual stream after adding x to it.
    Before the first block there is no residual yet: x itself is it."""
    if kernels is not None:
        if residual is None:
            return kernels.rms_norm(x, norm.weight, norm.eps), x
        return kernels.add_rms_norm(x, residual, norm.weight, norm.eps)
    residual = x if residual is None else residual + x
    return norm(residual), residual


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


_MATRICES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class DecoderLayer(nn.Module):
    """Pre-norm attention + SwiGLU block with merged projections."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, d
        self.q_size, self.kv_size = config.num_heads * d, config.num_kv_heads * d
        self.scale = d**-0.5
        qkv = self.q_size + 2 * self.kv_size
        self.input_norm = RMSNorm(h, config.rms_norm_eps, dtype)
        self.qkv_proj = nn.Parameter(torch.empty(qkv, h, dtype=dtype), requires_grad=False)
        self.qkv_bias = (
            nn.Parameter(torch.zeros(qkv, dtype=dtype), requires_grad=False) if config.attention_bias else None
        )
        self.o_proj = nn.Parameter(torch.empty(h, self.q_size, dtype=dtype), requires_grad=False)
        self.post_norm = RMSNorm(h, config.rms_norm_eps, dtype)
        self.gate_up_proj = nn.Parameter(torch.empty(2 * config.intermediate_size, h, dtype=dtype), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(h, config.intermediate_size, dtype=dtype), requires_grad=False)
        self.linear: Callable[..., torch.Tensor] = F.linear  # cpu_linear.linear once the matrices are packed
        # backend.kernels once use_fused_kernels has run (imported only then: on CPU triton stays unloaded)
        self.kernels: ModuleType | None = None

    def pack_weights(self) -> None:
        """Replace the four matrices by their oneDNN-packed form (see backend/cpu_linear.py)."""
        for name in _MATRICES:
            packed = cpu_linear.pack(getattr(self, name))
            delattr(self, name)
            self.register_buffer(name, packed, persistent=False)
        self.linear = cpu_linear.linear

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        attention: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One block; returns its output and the residual stream, which the next block's norm adds."""
        t = x.shape[0]
        h, residual = _add_norm(x, residual, self.input_norm, self.kernels)
        qkv = self.linear(h, self.qkv_proj, self.qkv_bias)
        if self.kernels is not None:
            q = qkv[:, : self.q_size].view(t, self.num_heads, self.head_dim)
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(t, self.num_kv_heads, self.head_dim)
            self.kernels.apply_rotary(rope[0], q, k, rope[1])  # in place, from (positions, cos_sin_cache)
        else:
            # Q and K heads are rotated together: one set of elementwise ops instead of two.
            qk = _rotate(qkv[:, : self.q_size + self.kv_size].view(t, -1, self.head_dim), *rope)
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        attention.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        o = attention.attend(q, k_cache, v_cache, meta, self.scale)
        o = self.linear(o.reshape(t, self.q_size), self.o_proj)
        h, residual = _add_norm(o, residual, self.post_norm, self.kernels)
        gate_up = self.linear(h, self.gate_up_proj)
        if self.kernels is not None:
            act = self.kernels.silu_and_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate) * up
        return self.linear(act, self.down_proj), residual


class LlamaModel(nn.Module):
    """Decoder stack, final norm and output head; `attention` is swappable (torch here, Triton on GPU)."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype = torch.float32,
        attention: AttentionBackend | None = None,
        rope_freq_factors: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.attention: AttentionBackend = attention or TorchAttention()
        self.embed_tokens = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size, dtype=dtype), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(config, dtype) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = (
            self.embed_tokens
            if config.tie_word_embeddings
            else nn.Parameter(torch.empty(config.vocab_size, config.hidden_size, dtype=dtype), requires_grad=False)
        )
        self.rotary = RotaryEmbedding(config, rope_freq_factors)
        self.packed_head: torch.Tensor | None = None
        self.kernels: ModuleType | None = None  # backend.kernels, once use_fused_kernels has run
        self.cos_sin_cache: torch.Tensor | None = None

    def use_fused_kernels(self) -> None:
        """Run norms (with their residual adds), rotary and SiLU-and-mul as Triton kernels (GPU, or the CPU
        interpreter in tests), with a cos/sin table covering every position the model accepts."""
        from backend.executor import kernels

        cache = kernels.build_cos_sin_cache(self.rotary.inv_freq, self.config.max_position_embeddings)
        self.cos_sin_cache = cache.to(self.embed_tokens.device)
        self.kernels = kernels
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            layer.kernels = kernels

    def pack_weights(self) -> None:
        """Pack every matrix for oneDNN, after loading, on CPU in float32 (see backend/cpu_linear.py).

        The head is packed into a copy: the embedding lookup still needs the plain matrix when they are tied.
        """
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            layer.pack_weights()
        self.packed_head = cpu_linear.pack(self.lm_head)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states `[T, hidden]` after the final norm; K/V of the new tokens are written to the caches."""
        x = F.embedding(input_ids, self.embed_tokens)
        if self.cos_sin_cache is not None:
            rope = (positions, self.cos_sin_cache)
        else:
            rope = self.rotary(positions, self.dtype)
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, rope, kv_cache, meta, self.attention)
        return _add_norm(x, residual, self.norm, self.kernels)[0]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits `[R, vocab]` for the rows of `hidden` the caller wants to sample from."""
        if self.packed_head is not None:
            return cpu_linear.linear(hidden, self.packed_head).float()
        return F.linear(hidden, self.lm_head).float()

    @torch.inference_mode()
    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy tensors named as in transformers' LlamaForCausalLM / Qwen2ForCausalLM, merging projections."""
        own: dict[str, torch.Tensor] = {}
        for name, tensor in weights.items():
            own[_hf_to_own(name)] = tensor
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, DecoderLayer)
            p = f"layers.{i}."
            _fill(layer.qkv_proj, torch.cat([_take(own, p + s + ".weight") for s in ("q", "k", "v")]))
            if layer.qkv_bias is not None:
                _fill(layer.qkv_bias, torch.cat([_take(own, p + s + ".bias") for s in ("q", "k", "v")]))
            _fill(layer.gate_up_proj, torch.cat([_take(own, p + "gate"), _take(own, p + "up")]))
            for name in ("o_proj", "down_proj", "input_norm", "post_norm"):
                param = getattr(layer, name)
                _fill(param if isinstance(param, nn.Parameter) else param.weight, _take(own, p + name))
        _fill(self.embed_tokens, _take(own, "embed_tokens"))
        _fill(self.norm.weight, _take(own, "norm"))
        head = own.pop("lm_head", None)
        if not self.config.tie_word_embeddings:
            if head is None:
                raise ValueError("the weights lack lm_head.weight and the config does not tie embeddings")
            _fill(self.lm_head, head)
        if own:
            raise ValueError(f"unexpected weights: {', '.join(sorted(own)[:5])}")


_HF_NAMES = [
    (re.compile(r"^model\.embed_tokens\.weight$"), "embed_tokens"),
    (re.compile(r"^model\.norm\.weight$"), "norm"),
    (re.compile(r"^lm_head\.weight$"), "lm_head"),
    (re.compile(r"^model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)$"), r"layers.\1.\2.\3"),
    (re.compile(r"^model\.layers\.(\d+)\.self_attn\.o_proj\.weight$"), r"layers.\1.o_proj"),
    (re.compile(r"^model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight$"), r"layers.\1.\2"),
    (re.compile(r"^model\.layers\.(\d+)\.input_layernorm\.weight$"), r"layers.\1.input_norm"),
    (re.compile(r"^model\.layers\.(\d+)\.post_attention_layernorm\.weight$"), r"layers.\1.post_norm"),
]


def _hf_to_own(name: str) -> str:
    for pattern, repl in _HF_NAMES:
        if pattern.match(name):
            own = pattern.sub(repl, name)
            return own.replace(".down", ".down_proj") if own.endswith(".down") else own
    raise ValueError(f"unexpected weight {name!r}")


def _take(weights: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    try:
        return weights.pop(name)
    except KeyError:
        raise ValueError(f"missing weight {name!r}") from None


def _fill(param: torch.Tensor, value: torch.Tensor) -> None:
    if tuple(param.shape) != tuple(value.shape):
        raise ValueError(f"weight shape {tuple(value.shape)} does not match the model's {tuple(param.shape)}")
    param.copy_(value)
