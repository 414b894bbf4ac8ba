"""Phi-3: Q, K and V in one trained matrix, gate and up in another (taken as they are); LongRoPE (rotary.py)."""

from __future__ import annotations

import re
from typing import ClassVar

from backend.executor.cpu.quant_blocks import Weight, as_float
from backend.executor.model.layer import DecoderLayer, fill, place, take
from backend.executor.model.model import LlamaModel


class Phi3Layer(DecoderLayer):
    """Once loaded, the Llama layer itself (so the C++ decode stack runs it too)."""

    def load(self, own: dict[str, Weight], prefix: str, quantization: str) -> None:
        for name in ("qkv_proj", "gate_up_proj", "o_proj", "down_proj"):
            place(self, name, take(own, prefix + name), quantization)
        for name in ("input_norm", "post_norm"):
            fill(getattr(self, name).weight, as_float(take(own, prefix + name)))


class Phi3Model(LlamaModel):
    LAYER = Phi3Layer
    HF_NAMES = (
        (re.compile(r"^model\.layers\.(\d+)\.self_attn\.qkv_proj\.weight$"), r"layers.\1.qkv_proj"),
        (re.compile(r"^model\.layers\.(\d+)\.mlp\.gate_up_proj\.weight$"), r"layers.\1.gate_up_proj"),
    )
    # llama.cpp writes the fused matrices as attn_qkv and ffn_up (gate rows first, as trained).
    GGUF_NAMES: ClassVar[dict[str, str]] = {
        "attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight",
    }
    GGUF_PERMUTED_QK = False
