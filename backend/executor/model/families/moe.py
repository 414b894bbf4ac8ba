"""Qwen3-MoE: the Qwen3 layer with its MLP replaced by `num_experts` SwiGLU experts, `num_experts_used` of them
chosen per token by a softmax router (top-k, optionally renormalized) and summed by their weights.

The experts are float matrices (a quantized GGUF's are dequantized at load); attention matrices follow
`--quantization` as in every family. Each step runs only the experts some token chose, one product each.
"""

from __future__ import annotations

import re
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from backend.executor.cpu.quant_blocks import Weight, as_float
from backend.executor.model.config import ModelConfig
from backend.executor.model.families.qwen import Qwen3Layer
from backend.executor.model.layer import fill, take
from backend.executor.model.model import LlamaModel
from backend.executor.model.ops import ModelOps
from backend.executor.model.rotary import Rotary


class MoELayer(Qwen3Layer):
    MATRICES: ClassVar[tuple[str, ...]] = ("qkv_proj", "o_proj")

    def __init__(self, config: ModelConfig, dtype: torch.dtype, ops: ModelOps, rotary: Rotary) -> None:
        super().__init__(config, dtype, ops, rotary)
        del self.gate_up_proj, self.down_proj
        e, h, i = config.num_experts, config.hidden_size, config.expert_intermediate_size
        self.top_k, self.norm_topk = config.num_experts_used, config.norm_topk_prob
        self.router = nn.Parameter(torch.empty(e, h, dtype=dtype), requires_grad=False)
        self.experts_gate_up = nn.Parameter(torch.empty(e, 2 * i, h, dtype=dtype), requires_grad=False)
        self.experts_down = nn.Parameter(torch.empty(e, h, i, dtype=dtype), requires_grad=False)

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        probs = F.linear(h, self.router).softmax(-1, dtype=torch.float32)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(-1, keepdim=True)
        weights = weights.to(h.dtype)
        out = torch.zeros_like(h)
        for expert in chosen.unique().tolist():  # ascending, as transformers adds them
            token, slot = (chosen == expert).nonzero(as_tuple=True)
            gate_up = F.linear(h.index_select(0, token), self.experts_gate_up[expert])
            y = F.linear(self.ops.silu_and_mul(gate_up), self.experts_down[expert])
            out.index_add_(0, token, y * weights[token, slot, None])
        return out

    def load_mlp(self, own: dict[str, Weight], prefix: str, quantization: str) -> None:
        fill(self.router, as_float(take(own, prefix + "router")))
        count = self.router.shape[0]
        kinds = ("gate", "up", "down_proj")
        if prefix + "experts.gate" in own:  # a GGUF file: one [experts, out, in] tensor per kind
            gate, up, down = (as_float(take(own, prefix + f"experts.{kind}")) for kind in kinds)
        else:  # an HF folder: one matrix per expert
            gate, up, down = (torch.stack([as_float(take(own, prefix + f"experts.{e}.{kind}")) for e in range(count)])
                              for kind in kinds)
        fill(self.experts_gate_up, torch.cat([gate, up], dim=1))
        fill(self.experts_down, down)


class Qwen3MoeModel(LlamaModel):
    LAYER = MoELayer
    HF_NAMES = (
        (re.compile(r"^model\.layers\.(\d+)\.self_attn\.([qk])_norm\.weight$"), r"layers.\1.\2_norm"),
        (re.compile(r"^model\.layers\.(\d+)\.mlp\.gate\.weight$"), r"layers.\1.router"),
        (re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$"),
         r"layers.\1.experts.\2.\3"),
        (re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate|up|down)_proj\.weight$"), r"layers.\1.experts.\2"),
    )
    GGUF_NAMES: ClassVar[dict[str, str]] = {
        "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
        "ffn_gate_inp.weight": "mlp.gate.weight", "ffn_gate_exps.weight": "mlp.experts.gate_proj.weight",
        "ffn_up_exps.weight": "mlp.experts.up_proj.weight", "ffn_down_exps.weight": "mlp.experts.down_proj.weight",
    }
    GGUF_PERMUTED_QK = False
    NATIVE_BLOCKS = False  # the experts, most of the weights, are dequantized
