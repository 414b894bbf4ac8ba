"""A decode step's decoder layers in one C++ call (csrc/decode_stack.cpp), where the CPU model allows it.

A one-token step of SmolLM2-135M on two cores spends about a fifth of its time in Python between kernels:
each layer makes ~19 torch-level calls (norms, four block products, rotation, KV write, attention, views).
When every matrix of every layer is kept in GGML blocks (`BlockWeight`, or a `StackedWeight` of them), the row-wise ops and the attention
are the extension's own, and the step's attention plan sends every row to the paged kernel (decodes and
speculative verifications, no prefill chunk), the layers run in one call instead. That call runs the same
kernels in the same order on the same views, so hidden states and KV are the same bits as the Python loop's;
any other step (prefill chunks, other quantizations, the SDPA or Triton paths) keeps the loop.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Protocol, cast

import torch
from torch import nn

from backend.executor.attention.torch_attention import TorchAttention, TorchAttentionPlan
from backend.executor.cpu import elementwise_kernel
from backend.executor.cpu.block_linear import ACTIVATION_BITS, KINDS, BlockWeight
from backend.executor.model.layer import DecoderLayer, RMSNorm
from backend.executor.model.ops import ModelOps
from backend.executor.model.quantized_linear import StackedWeight
from backend.executor.model.rotary import Rotary

_ABSENT = torch.empty(0)


class Decoder(Protocol):
    """What the stack is built from: a `LlamaModel` (model.py), which builds its own stack on load."""

    @property
    def ops(self) -> ModelOps: ...
    @property
    def layers(self) -> nn.ModuleList: ...
    @property
    def norm(self) -> RMSNorm: ...
    @property
    def rotary(self) -> Rotary: ...


class FusedLayers:
    """The C++ decode stack of one model, built once after its weights are loaded."""

    def __init__(self, stack: Any) -> None:
        self._stack = stack

    @classmethod
    def build(cls, model: Decoder) -> FusedLayers | None:
        """The stack for `model`, or None where some layer or op is not one the C++ call runs."""
        ops = model.ops
        if not (ops.rotary is elementwise_kernel.rotate and ops.add_rms_norm is elementwise_kernel.add_rms_norm
                and isinstance(ops.attention, TorchAttention) and ops.attention.use_kernel):
            return None
        tensors: list[torch.Tensor] = []
        kinds: list[int] = []
        out_features: list[int] = []
        parts: list[int] = []
        bits: set[int] = set()
        kernel: ModuleType | None = None
        layers = cast("list[DecoderLayer]", list(model.layers))
        if not all(layer.FUSABLE for layer in layers):  # other families' layers run the Python loop
            return None
        for layer in layers:
            matrices = [_parts(getattr(layer, name)) for name in layer.MATRICES]
            if any(m is None for m in matrices):
                return None
            bias = layer.qkv_bias
            tensors += [layer.input_norm.weight, layer.post_norm.weight, _ABSENT if bias is None else bias]
            for matrix in matrices:
                assert matrix is not None
                parts.append(len(matrix))
                for m in matrix:
                    tensors += [m.quants, m.scales, _ABSENT if m.mins is None else m.mins]
                    kinds.append(KINDS[m.kind])
                    out_features.append(m.shape[0])
                    bits.add(ACTIVATION_BITS[m.decode_activations])
                    kernel = m.kernel
        if kernel is None or len(bits) != 1 or not hasattr(kernel, "DecodeStack"):
            return None
        first = layers[0]
        stack = kernel.DecodeStack(
            tensors, kinds, out_features, parts, bits.pop(), first.num_heads, first.num_kv_heads, first.head_dim,
            model.norm.eps, first.scale, model.norm.weight, model.rotary.cos_sin_cache,
        )
        return cls(stack)

    def run(self, x: torch.Tensor, positions: torch.Tensor, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
            plan: object) -> torch.Tensor | None:
        """The final-norm hidden states of the step, or None when its plan needs the Python loop."""
        if not (isinstance(plan, TorchAttentionPlan) and plan.kernel is not None and plan.kernel_slots is not None
                and not plan.decodes and not plan.prefills and plan.covers_all_rows):
            return None
        rows = plan.kernel
        out: torch.Tensor = self._stack.run(
            x, positions, [k for k, _ in kv_caches], [v for _, v in kv_caches], plan.kernel_slots,
            rows.starts, rows.q_lens, rows.context_lens, rows.block_tables,
        )
        return out


def _parts(matrix: object) -> list[BlockWeight] | None:
    """The block matrices a layer's matrix is made of (several for a `StackedWeight`), None if it is not blocks."""
    if isinstance(matrix, BlockWeight):
        return [matrix]
    if isinstance(matrix, StackedWeight):
        return list(matrix.parts)
    return None
