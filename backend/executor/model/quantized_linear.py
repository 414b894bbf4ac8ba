"""Matrix products on quantized weights (CPU): int4 in 32-value groups and int8 per output row.

torch ships both kernels for CPU: `_weight_int4pack_mm_for_cpu` (weights `(q - 8) * scale + zero` per group of
32 inputs) and `_weight_int8pack_mm` (weights `q * scale` per output row). Their vectorized paths take
bfloat16 activations only (float32 ones ran 10-30x slower on AVX2), so the activations are rounded to bfloat16
for the product and its result is returned in the caller's dtype. GGML's Q4_0 and Q4_1 blocks map exactly
onto the int4 form (their float16 scales rounded to bfloat16); Q8_0's per-block scales do not fit the
per-row int8 form, so Q8_0 matrices are requantized per row (docs/engine.md gives the perplexity cost).
Where the block kernel builds (block_kernel.py), `auto` keeps the file's blocks instead and multiplies them
with their exact values (block_linear.py; the K-quants' super-blocks: k_quants.py); these torch forms are then
what `int4` and `int8` ask for. A merged matrix whose parts the file keeps in different block kinds is kept as
its parts, one block product each (`StackedWeight`).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from backend.executor.cpu import block_kernel
from backend.executor.cpu.block_linear import BlockWeight, from_blocks
from backend.executor.cpu.k_quants import from_k_blocks
from backend.executor.cpu.quant_blocks import BLOCK, K_KINDS, BlockQuantized, MixedRows, Weight, as_float

GROUP = BLOCK  # inputs per int4 scale; GGML's block size, so Q4 blocks keep their own scales


@dataclass(slots=True)
class Int4Weight:
    """`[out, in]` int4 weights in torch's CPU packing, with bfloat16 `scales_and_zeros` `[in / 32, out, 2]`."""

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor
    shape: tuple[int, int]

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(_rows(x, self.shape), self.packed, GROUP, self.scales_and_zeros)
        return _finish(out, x, self.shape, bias)


@dataclass(slots=True)
class Int8Weight:
    """`[out, in]` int8 weights with one bfloat16 scale per output row (also the embedding's rows)."""

    weight: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, int]

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.ops.aten._weight_int8pack_mm(_rows(x, self.shape), self.weight, self.scales)
        return _finish(out, x, self.shape, bias)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The dequantized rows `ids` (an embedding lookup), in `dtype`."""
        return (self.weight[ids].to(torch.float32) * self.scales[ids].to(torch.float32).unsqueeze(-1)).to(dtype)


@dataclass(slots=True)
class StackedWeight:
    """Block matrices of different kinds stacked along their output rows (`MixedRows`): one product each, their
    outputs side by side."""

    parts: list[BlockWeight]
    shape: tuple[int, int]

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.cat([p.linear(x) for p in self.parts], dim=-1)
        return out if bias is None else out + bias


QuantizedWeight = Int4Weight | Int8Weight | BlockWeight | StackedWeight


def _rows(x: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    return x.reshape(-1, shape[1]).to(torch.bfloat16)


def _finish(out: torch.Tensor, x: torch.Tensor, shape: tuple[int, int], bias: torch.Tensor | None) -> torch.Tensor:
    out = out.to(x.dtype).reshape(*x.shape[:-1], shape[0])
    return out if bias is None else out + bias


def int4_from_quants(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> Int4Weight:
    """Pack quants `[out, in]` (0..15) with per-group `scale` and `zero` `[out, in / 32]`:
    `w = (q - 8) * scale + zero`."""
    rows, cols = q.shape
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
    scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).to(torch.bfloat16).contiguous()
    return Int4Weight(packed, scales_and_zeros, (rows, cols))


def quantize_int4(weight: Weight) -> Int4Weight:
    """Q4_0/Q4_1 blocks as they are; anything else rounded to 16 levels between each group's min and max."""
    if isinstance(weight, BlockQuantized) and weight.kind in ("Q4_0", "Q4_1"):
        q, d, m = weight.quants()
        # Q4_1's d*q + m is d*(q - 8) + (m + 8d); Q4_0 is already d*(q - 8).
        return int4_from_quants(q, d, torch.zeros_like(d) if m is None else m + 8 * d)
    w = as_float(weight).float()
    rows, cols = w.shape
    groups = w.reshape(rows, cols // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    # Rounded to bfloat16 before quantizing, so that the quants fit the scales the kernel reads.
    scale = _bf16((high - low) / 15).clamp(min=2**-100)
    zero = _bf16(low + 8 * scale)
    q = ((groups - zero.unsqueeze(-1)) / scale.unsqueeze(-1) + 8).round().clamp(0, 15).reshape(rows, cols)
    return int4_from_quants(q, scale, zero)


def quantize_int8(weight: Weight) -> Int8Weight:
    """Symmetric int8 per output row (Q8_0 blocks are dequantized exactly first, then requantized per row)."""
    w = as_float(weight).float()
    scale = _bf16(w.abs().amax(-1) / 127).clamp(min=2**-100)
    q = (w / scale.unsqueeze(-1)).round().clamp(-127, 127).to(torch.int8)
    rows, cols = w.shape
    return Int8Weight(q.contiguous(), scale.to(torch.bfloat16), (rows, cols))


def _bf16(values: torch.Tensor) -> torch.Tensor:
    return values.to(torch.bfloat16).to(torch.float32)


def form_for(mode: str, weight: Weight) -> str:
    """How a matrix is kept under `--quantization mode`: "dense", "blocks", "int4" or "int8". `auto` keeps the
    file's own blocks for the block kernel (where it does not build: Q4_0/Q4_1 as int4, Q8_0/Q5_0 as int8, the
    K-quants dequantized, since requantizing them would lose precision) and float matrices float."""
    if mode in ("int4", "int8"):
        return mode
    if mode == "auto" and isinstance(weight, BlockQuantized | MixedRows):
        if block_kernel.load() is not None:
            return "blocks"
        kinds = {p.kind for p in weight.parts} if isinstance(weight, MixedRows) else {weight.kind}
        if kinds & set(K_KINDS) or len(kinds) > 1:
            return "dense"
        return "int8" if kinds <= {"Q8_0", "Q5_0"} else "int4"  # Q5_0's 32 levels would not fit int4's 16
    return "dense"


def quantize(weight: Weight, form: str) -> QuantizedWeight:
    if form == "blocks":
        kernel = block_kernel.load()
        assert kernel is not None, "form_for chose blocks"
        if isinstance(weight, MixedRows):
            return StackedWeight([_blocks(p, kernel) for p in weight.parts], weight.shape)
        assert isinstance(weight, BlockQuantized), "form_for chose blocks"
        return _blocks(weight, kernel)
    return quantize_int4(weight) if form == "int4" else quantize_int8(weight)


def _blocks(weight: BlockQuantized, kernel: ModuleType) -> BlockWeight:
    return from_k_blocks(weight, kernel) if weight.kind in K_KINDS else from_blocks(weight, kernel)


def available() -> bool:
    """Whether this torch build has both CPU kernels."""
    ops = torch.ops.aten
    return hasattr(ops, "_weight_int4pack_mm_for_cpu") and hasattr(ops, "_weight_int8pack_mm")
