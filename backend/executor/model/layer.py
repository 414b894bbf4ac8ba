"""One Llama-family decoder layer (pre-norm attention and a SwiGLU block, projections merged) and the norm
and matrix product every layer and the model's head share; `LlamaModel` (model.py) stacks them."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from backend.executor.cpu.quant_blocks import Weight, as_float, concat_rows
from backend.executor.model.config import ModelConfig
from backend.executor.model.ops import ModelOps
from backend.executor.model.quantized_linear import QuantizedWeight, form_for, quantize
from backend.executor.model.rotary import Rotary
from backend.executor.model.vocabulary import Vocabulary


class RMSNorm(nn.Module):
    """The weight and epsilon of one root-mean-square norm; `ModelOps.rms_norm` applies them."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False)
        self.eps = eps


def add_norm(
    x: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm, ops: ModelOps
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(norm(x + residual), x + residual)`: a block's input and the residual stream after adding x to it.
    Before the first block there is no residual yet: x itself is it. The ops may add x into the residual in
    place: the stream is the forward's own tensor (the embedding rows, fresh each call), and no one else holds it."""
    if residual is None:
        return ops.rms_norm(x, norm.weight, norm.eps), x
    return ops.add_rms_norm(x, residual, norm.weight, norm.eps)


def linear(
    ops: ModelOps, x: torch.Tensor, weight: torch.Tensor | QuantizedWeight | Vocabulary,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    if isinstance(weight, torch.Tensor):
        return ops.linear(x, weight, bias)
    return weight.linear(x, bias)


class DecoderLayer(nn.Module):
    """Pre-norm attention + SwiGLU block with merged projections."""

    MATRICES: ClassVar[tuple[str, ...]] = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    FUSABLE: ClassVar[bool] = True  # the C++ decode stack (fused_step.py) computes exactly this layer
    GRAPH_SAFE: ClassVar[bool] = True  # its forward never reads a device value on the host: a CUDA graph captures it

    def __init__(self, config: ModelConfig, dtype: torch.dtype, ops: ModelOps, rotary: Rotary) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.ops = ops
        self.rotary = rotary  # one table, shared by every layer
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

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        plan: object,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One block; returns its output and the residual stream, which the next block's norm adds."""
        h, residual = add_norm(x, residual, self.input_norm, self.ops)
        o = self.attention(h, positions, kv_cache, plan)
        h, residual = add_norm(o, residual, self.post_norm, self.ops)
        return self.mlp(h), residual

    def attention(
        self, h: torch.Tensor, positions: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], plan: object
    ) -> torch.Tensor:
        """Attention of the normed rows `h`, through the output projection; writes their K/V to the cache."""
        ops, t = self.ops, h.shape[0]
        qkv = linear(ops, h, self.qkv_proj, self.qkv_bias)
        q, k = self.rotate_qk(qkv[:, : self.q_size + self.kv_size].view(t, -1, self.head_dim), positions)
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        ops.attention.write_kv(k, v, k_cache, v_cache, plan)
        o = self.attend(q, k_cache, v_cache, plan)
        return linear(ops, o.reshape(t, self.q_size), self.o_proj)

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: object) -> torch.Tensor:
        return self.ops.attention.attend(q, k_cache, v_cache, plan, self.scale)

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        return linear(self.ops, self.ops.silu_and_mul(linear(self.ops, h, self.gate_up_proj)), self.down_proj)

    def rotate_qk(self, qk: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The q and k heads of `qk` `[T, heads + kv_heads, head_dim]`, ready for attention."""
        return self.rotary(positions, qk, self.num_heads)

    def load(self, own: dict[str, Weight], prefix: str, quantization: str) -> None:
        """Take this layer's tensors (own names, `prefix` = `layers.{i}.`) out of `own`."""
        place(self, "qkv_proj", concat_rows([take(own, prefix + s + ".weight") for s in ("q", "k", "v")]), quantization)
        if self.qkv_bias is not None:
            fill(self.qkv_bias, torch.cat([as_float(take(own, prefix + s + ".bias")) for s in ("q", "k", "v")]))
        place(self, "o_proj", take(own, prefix + "o_proj"), quantization)
        self.load_mlp(own, prefix, quantization)
        for name in ("input_norm", "post_norm"):
            fill(getattr(self, name).weight, as_float(take(own, prefix + name)))

    def load_mlp(self, own: dict[str, Weight], prefix: str, quantization: str) -> None:
        place(self, "gate_up_proj", concat_rows([take(own, prefix + "gate"), take(own, prefix + "up")]), quantization)
        place(self, "down_proj", take(own, prefix + "down_proj"), quantization)


def take(weights: dict[str, Weight], name: str) -> Weight:
    try:
        return weights.pop(name)
    except KeyError:
        raise ValueError(f"missing weight {name!r}") from None


def place(module: nn.Module, name: str, weight: Weight, quantization: str) -> None:
    """Fill the float matrix `name`, or replace it by its quantized form (its float storage never touched)."""
    param = getattr(module, name)
    form = form_for(quantization, weight)
    if form == "dense":
        fill(param, as_float(weight))
        return
    if tuple(param.shape) != tuple(weight.shape):
        raise ValueError(f"weight shape {tuple(weight.shape)} does not match the model's {tuple(param.shape)}")
    delattr(module, name)
    setattr(module, name, quantize(weight, form))


def fill(param: torch.Tensor, value: torch.Tensor) -> None:
    if tuple(param.shape) != tuple(value.shape):
        raise ValueError(f"weight shape {tuple(value.shape)} does not match the model's {tuple(param.shape)}")
    param.copy_(value)
