"""Mixture of experts, shared by the Qwen3-MoE (qwen.py) and Mixtral (mixtral.py) families: a layer's MLP is
`num_experts` SwiGLU experts, `num_experts_used` of them chosen per token by a softmax router (top-k, optionally
renormalized) and summed by their weights.

Each expert's matrices are placed as every other matrix is (`layer.place`): under `--quantization auto` a GGUF
file's blocks stay blocks and the block products multiply them; float weights stay float (packed for oneDNN where
the op set packs). A step groups its tokens by expert and runs one pair of products per expert some token chose.
"""

from __future__ import annotations

import re
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from backend.executor.cpu.quant_blocks import BlockQuantized, Weight, as_float, concat_rows
from backend.executor.model.config import ModelConfig
from backend.executor.model.layer import DecoderLayer, fill, linear, place, take
from backend.executor.model.ops import ModelOps
from backend.executor.model.rotary import Rotary

_KINDS = ("gate", "up", "down_proj")  # own names of an expert's matrices (`_hf_to_own` spells down so)

# Names both families' weights arrive under: the router, llama.cpp's one tensor per kind for all experts (GGUF
# files, renamed by `GGUF_NAMES`), and one matrix per expert (Qwen3-MoE folders, older Mixtral GGUF files).
HF_NAMES = (
    (re.compile(r"^model\.layers\.(\d+)\.mlp\.gate\.weight$"), r"layers.\1.router"),
    (re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate|up|down)_proj\.weight$"), r"layers.\1.experts.\2"),
    (re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$"),
     r"layers.\1.experts.\2.\3"),
)
GGUF_NAMES = {
    "ffn_gate_inp.weight": "mlp.gate.weight", "ffn_gate_exps.weight": "mlp.experts.gate_proj.weight",
    "ffn_up_exps.weight": "mlp.experts.up_proj.weight", "ffn_down_exps.weight": "mlp.experts.down_proj.weight",
}


class Expert(nn.Module):
    """One SwiGLU expert: gate and up merged into one matrix, as in the dense layer."""

    MATRICES: ClassVar[tuple[str, ...]] = ("gate_up_proj", "down_proj")

    def __init__(self, hidden: int, intermediate: int, dtype: torch.dtype, ops: ModelOps) -> None:
        super().__init__()
        self.ops = ops
        self.gate_up_proj = nn.Parameter(torch.empty(2 * intermediate, hidden, dtype=dtype), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(hidden, intermediate, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = self.ops
        return linear(ops, ops.silu_and_mul(linear(ops, x, self.gate_up_proj)), self.down_proj)


class RoutedExperts(nn.Module):
    """The router and the experts of one layer."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, ops: ModelOps) -> None:
        super().__init__()
        e, h, i = config.num_experts, config.hidden_size, config.expert_intermediate_size
        self.top_k, self.norm_topk = config.num_experts_used, config.norm_topk_prob
        self.router = nn.Parameter(torch.empty(e, h, dtype=dtype), requires_grad=False)  # never quantized: it picks
        self.experts = nn.ModuleList(Expert(h, i, dtype, ops) for _ in range(e))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        probs = F.linear(h, self.router).softmax(-1, dtype=torch.float32)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(-1, keepdim=True)
        weights = weights.to(h.dtype).flatten()
        # The (token, slot) pairs sorted by expert: each expert's tokens are one slice, counted in one host sync.
        flat = chosen.flatten()
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        out = torch.zeros_like(h)
        start = 0
        for expert, count in zip(self.experts, counts, strict=True):  # ascending, as transformers adds them
            if count:
                pairs = order[start : start + count]
                tokens = pairs // self.top_k
                out.index_add_(0, tokens, expert(h.index_select(0, tokens)) * weights[pairs, None])
                start += count
        return out

    def load(self, own: dict[str, Weight], prefix: str, quantization: str) -> None:
        fill(self.router, as_float(take(own, prefix + "router")))
        count = len(self.experts)
        if prefix + "experts.gate" in own:  # a GGUF file: one tensor per kind, the experts' matrices stacked
            gate, up, down = (_per_expert(take(own, prefix + f"experts.{kind}"), count) for kind in _KINDS)
        else:
            gate, up, down = ([take(own, prefix + f"experts.{e}.{kind}") for e in range(count)] for kind in _KINDS)
        for expert, g, u, d in zip(self.experts, gate, up, down, strict=True):
            place(expert, "gate_up_proj", concat_rows([g, u]), quantization)
            place(expert, "down_proj", d, quantization)


def _per_expert(stacked: Weight, count: int) -> list[Weight]:
    """`[experts, out, in]` as `count` matrices: a float tensor's views, or the rows of blocks (kept as the
    experts' `experts * out` rows)."""
    if isinstance(stacked, BlockQuantized):
        rows, remainder = divmod(stacked.shape[0], count)
        if remainder:
            raise ValueError(f"{stacked.shape[0]} expert rows do not split into {count} experts")
        return [stacked.take_rows(torch.arange(e * rows, (e + 1) * rows)) for e in range(count)]
    assert isinstance(stacked, torch.Tensor), "a file's stacked experts are one tensor"
    if stacked.dim() != 3 or stacked.shape[0] != count:
        raise ValueError(f"expert tensor shape {tuple(stacked.shape)} does not hold {count} experts")
    return list(stacked.unbind(0))


class RoutedLayer(DecoderLayer):
    """A decoder layer whose MLP is routed experts: Mixtral's layer, and the front of Qwen3-MoE's
    (`class Qwen3MoeLayer(RoutedLayer, Qwen3Layer)`, which adds its head norms)."""

    MATRICES: ClassVar[tuple[str, ...]] = ("qkv_proj", "o_proj")  # the experts name their own
    FUSABLE = False  # the C++ decode stack computes the dense MLP only
    GRAPH_SAFE = False  # the host reads how many tokens each expert got

    def __init__(self, config: ModelConfig, dtype: torch.dtype, ops: ModelOps, rotary: Rotary) -> None:
        super().__init__(config, dtype, ops, rotary)
        del self.gate_up_proj, self.down_proj
        self.routed = RoutedExperts(config, dtype, ops)

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        return self.routed(h)

    def load_mlp(self, own: dict[str, Weight], prefix: str, quantization: str) -> None:
        self.routed.load(own, prefix, quantization)
