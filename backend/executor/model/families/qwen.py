"""Qwen2 (biases on Q/K/V, the rows as trained), Qwen3 (an RMSNorm over each Q and K head before RoPE) and
Qwen3-MoE (the Qwen3 layer with routed experts for its MLP, moe.py)."""

from __future__ import annotations

import re
from typing import ClassVar

import torch

from backend.executor.cpu.quant_blocks import Weight, as_float
from backend.executor.model.config import ModelConfig
from backend.executor.model.families import moe
from backend.executor.model.layer import DecoderLayer, RMSNorm, fill, take
from backend.executor.model.model import LlamaModel
from backend.executor.model.ops import ModelOps
from backend.executor.model.rotary import Rotary


class Qwen2Model(LlamaModel):
    """The Llama layer with Q/K/V biases (config.attention_bias); llama.cpp leaves its Q and K rows as they are."""

    GGUF_PERMUTED_QK = False


def norm_heads(ops: ModelOps, qk: torch.Tensor, num_heads: int, q_norm: RMSNorm, k_norm: RMSNorm) -> torch.Tensor:
    """`qk` `[T, heads + kv_heads, d]` with every Q head through `q_norm` and every K head through `k_norm`."""
    t, _, d = qk.shape
    q = ops.rms_norm(qk[:, :num_heads].reshape(-1, d), q_norm.weight, q_norm.eps)
    k = ops.rms_norm(qk[:, num_heads:].reshape(-1, d), k_norm.weight, k_norm.eps)
    return torch.cat([q.view(t, -1, d), k.view(t, -1, d)], dim=1)


class Qwen3Layer(DecoderLayer):
    FUSABLE = False

    def __init__(self, config: ModelConfig, dtype: torch.dtype, ops: ModelOps, rotary: Rotary) -> None:
        super().__init__(config, dtype, ops, rotary)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype)

    def rotate_qk(self, qk: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary(positions, norm_heads(self.ops, qk, self.num_heads, self.q_norm, self.k_norm), self.num_heads)

    def load(self, own: dict[str, Weight], prefix: str, quantization: str) -> None:
        super().load(own, prefix, quantization)
        fill(self.q_norm.weight, as_float(take(own, prefix + "q_norm")))
        fill(self.k_norm.weight, as_float(take(own, prefix + "k_norm")))


class Qwen3Model(LlamaModel):
    LAYER = Qwen3Layer
    HF_NAMES: ClassVar[tuple[tuple[re.Pattern[str], str], ...]] = ((re.compile(r"^model\.layers\.(\d+)\.self_attn\.([qk])_norm\.weight$"), r"layers.\1.\2_norm"),)
    GGUF_NAMES: ClassVar[dict[str, str]] = {
        "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    }
    GGUF_PERMUTED_QK = False


class Qwen3MoeLayer(moe.RoutedLayer, Qwen3Layer):
    """Qwen3's attention (head norms), routed experts for the MLP."""


class Qwen3MoeModel(Qwen3Model):
    LAYER = Qwen3MoeLayer
    HF_NAMES = Qwen3Model.HF_NAMES + moe.HF_NAMES
    GGUF_NAMES = {**Qwen3Model.GGUF_NAMES, **moe.GGUF_NAMES}
