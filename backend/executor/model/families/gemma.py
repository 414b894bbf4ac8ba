"""Gemma 2 and Gemma 3 (text): embeddings scaled by sqrt(hidden), norms that scale by 1 + weight, a norm after
attention and around the MLP, GELU (tanh) gating, windowed layers interleaved with global ones, soft-capped
attention and final logits (Gemma 2), per-head Q/K norms and a separate RoPE base for windowed layers (Gemma 3).

Attention runs `WindowedAttention` (the window as a mask over the full paged KV, the soft cap on the logits):
never the C++ decode stack or the Triton kernels.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import ClassVar

import torch
import torch.nn.functional as F

from backend.executor.attention.windowed_attention import WindowedAttention, WindowedPlan
from backend.executor.cpu.quant_blocks import Weight, as_float
from backend.executor.model.config import ModelConfig
from backend.executor.model.families.qwen import norm_heads
from backend.executor.model.layer import DecoderLayer, RMSNorm, add_norm, fill, linear, take
from backend.executor.model.model import LlamaModel
from backend.executor.model.ops import ModelOps, ops_for
from backend.executor.model.rotary import Rotary

_NORMS = ("pre_ffn_norm", "post_ffn_norm")


class GemmaLayer(DecoderLayer):
    FUSABLE = False
    HEAD_NORMS: ClassVar[bool] = False

    def __init__(self, config: ModelConfig, dtype: torch.dtype, ops: ModelOps, rotary: Rotary) -> None:
        super().__init__(config, dtype, ops, rotary)
        self.scale = (config.query_pre_attn_scalar or config.head_dim) ** -0.5
        self.softcap = config.attn_logit_softcapping
        self.window: int | None = None  # set by the model for the windowed layers
        self.pre_ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype)  # read by Gemma 3 only
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype)
        self.extra_norms = _NORMS + (("q_norm", "k_norm") if self.HEAD_NORMS else ())

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor], plan: object,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ops = self.ops
        h, residual = add_norm(x, residual, self.input_norm, ops)
        o = ops.rms_norm(self.attention(h, positions, kv_cache, plan), self.post_norm.weight, self.post_norm.eps)
        h, residual = ops.add_rms_norm(o, residual, self.pre_ffn_norm.weight, self.pre_ffn_norm.eps)
        gate, up = linear(ops, h, self.gate_up_proj).chunk(2, dim=-1)
        out = linear(ops, F.gelu(gate, approximate="tanh").mul_(up), self.down_proj)
        return ops.rms_norm(out, self.post_ffn_norm.weight, self.post_ffn_norm.eps), residual

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: object) -> torch.Tensor:
        attention = self.ops.attention
        assert isinstance(attention, WindowedAttention) and isinstance(plan, WindowedPlan)
        return attention.attend_with(q, k_cache, v_cache, plan, self.scale, softcap=self.softcap, window=self.window)

    def rotate_qk(self, qk: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.HEAD_NORMS:
            qk = norm_heads(self.ops, qk, self.num_heads, self.q_norm, self.k_norm)
        return self.rotary(positions, qk, self.num_heads)

    def load(self, own: dict[str, Weight], prefix: str, quantization: str) -> None:
        super().load(own, prefix, quantization)
        for name in self.extra_norms:
            fill(getattr(self, name).weight, as_float(take(own, prefix + name)))


class Gemma3Layer(GemmaLayer):
    HEAD_NORMS = True


class Gemma2Model(LlamaModel):
    LAYER: ClassVar[type[DecoderLayer]] = GemmaLayer
    HF_NAMES = (
        (re.compile(r"^model\.layers\.(\d+)\.pre_feedforward_layernorm\.weight$"), r"layers.\1.pre_ffn_norm"),
        (re.compile(r"^model\.layers\.(\d+)\.post_feedforward_layernorm\.weight$"), r"layers.\1.post_ffn_norm"),
        (re.compile(r"^model\.layers\.(\d+)\.self_attn\.([qk])_norm\.weight$"), r"layers.\1.\2_norm"),
    )
    GGUF_NAMES: ClassVar[dict[str, str]] = {
        "post_attention_norm.weight": "post_attention_layernorm.weight",
        "ffn_norm.weight": "pre_feedforward_layernorm.weight",
        "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
        "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    }
    GGUF_PERMUTED_QK = False
    GGUF_NORM_SHIFT = 1.0

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32, ops: ModelOps | None = None,
                 rope_freq_factors: torch.Tensor | None = None) -> None:
        ops = ops or ops_for(str(torch.get_default_device()), dtype)
        super().__init__(config, dtype, dataclasses.replace(ops, attention=WindowedAttention()), rope_freq_factors)
        local = self.rotary
        if config.rope_local_theta is not None:
            local_config = dataclasses.replace(config, rope_theta=config.rope_local_theta, rope_scaling=None)
            local = Rotary(local_config, self.ops.rotary)
        windowed = config.sliding_window_layers or ()
        for layer, is_windowed in zip(self.layers, windowed, strict=True):
            assert isinstance(layer, GemmaLayer)
            if is_windowed:
                layer.window, layer.rotary = config.sliding_window, local
        self.local_rotary = local

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = super().embed(input_ids)
        return x * torch.tensor(self.config.hidden_size**0.5, dtype=x.dtype)  # rounded to the dtype, as trained

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def load_weights(self, weights: Mapping[str, Weight], quantization: str = "none") -> None:
        # Checkpoints hold w of the 1 + w scale; the shared norm op multiplies by its weight.
        shifted = {name: as_float(w) + 1.0 if name.endswith("norm.weight") else w for name, w in weights.items()}
        super().load_weights(shifted, quantization)


class Gemma3Model(Gemma2Model):
    LAYER = Gemma3Layer
