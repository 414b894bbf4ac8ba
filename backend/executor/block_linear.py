"""Matrices kept in the GGUF file's own blocks (Q4_0, Q4_1, Q8_0), multiplied by the C++ kernel.

The kernel (csrc/block_matmul.cpp, built by block_kernel.py) multiplies with the file's values. From 9
activation rows on (prefill, big batches) it dequantizes each block exactly inside a float32 GEMM, so `linear`
equals `F.linear(x, the file's float32 matrix)` up to summation order (at what dequantizing and calling oneDNN
costs, even at 1,024 rows: docs/benchmarks.md). For 1 to 8 rows (decode steps) a `BlockWeight` chooses between
the same exact float32 product and integer ones in llama.cpp's manner: each row quantized per 32 values to 16
or 8 bits, integer dot products with the blocks (csrc/block_integer_dot.cpp). `DECODE_ACTIVATIONS` is that
choice. At load the blocks are split into their quants and their float16 scales (and Q4_1's minimums), the
layout the kernel reads; the values stay the file's.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from backend.executor.quant_blocks import BLOCK, BLOCK_BYTES, BlockQuantized

KINDS = {"Q4_0": 0, "Q4_1": 1, "Q8_0": 2}
ACTIVATION_BITS = {"float32": 32, "int16": 16, "int8": 8}

# What the activations of 1 to 8 rows are multiplied as (docs/benchmarks.md, "Integer decode products"):
# int16 makes a batch-1 step's products ~1.7x faster than float32 with the perplexity and the greedy answers
# of `none`; int8 (llama.cpp's) is hardly faster on AVX2 without VNNI and raised the perplexity 1.5%.
DECODE_ACTIVATIONS = "int16"


@dataclass(slots=True)
class BlockWeight:
    """`[out, in]` weights as uint8 `quants` `[out, in / 2]` (Q4) or `[out, in]` (Q8_0), float16 `scales` and
    (Q4_1) `mins` `[out, in / 32]`, and the kernel that multiplies them; `decode_activations` (a key of
    `ACTIVATION_BITS`): how 1 to 8 rows are multiplied (more rows always exactly, in float32)."""

    kind: str
    quants: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None
    shape: tuple[int, int]
    kernel: ModuleType
    decode_activations: str

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        # A step's float32 rows, as the model passes them, go in as they are: four no-op calls fewer.
        plain = x.dtype is torch.float32 and x.dim() == 2
        rows = x if plain else x.reshape(-1, self.shape[1]).float()
        out = self.kernel.linear(rows, self.quants, self.scales, self.mins, KINDS[self.kind],
                                 ACTIVATION_BITS[self.decode_activations])
        if not plain:
            out = out.to(x.dtype).reshape(*x.shape[:-1], self.shape[0])
        return out if bias is None else out + bias

    def dequantize(self, begin: int = 0, end: int | None = None) -> torch.Tensor:
        """Rows `begin:end` as float32, the file's values exactly."""
        stop = self.shape[0] if end is None else end
        kind = KINDS[self.kind]
        result: torch.Tensor = self.kernel.dequantize(self.quants, self.scales, self.mins, kind, begin, stop)
        return result

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The rows `ids` (an embedding lookup), in `dtype`."""
        mins = None if self.mins is None else self.mins[ids]
        shape = (len(ids), self.shape[1])
        taken = BlockWeight(self.kind, self.quants[ids], self.scales[ids], mins, shape, self.kernel, "float32")
        return taken.dequantize().to(dtype)


def from_blocks(
    weight: BlockQuantized, kernel: ModuleType, decode_activations: str = DECODE_ACTIVATIONS
) -> BlockWeight:
    """Split the file's blocks into the kernel's arrays (the raw bytes moved, no value changed)."""
    rows, cols = weight.shape
    b = weight.blocks.view(rows, cols // BLOCK, BLOCK_BYTES[weight.kind])
    scales = b[..., 0:2].contiguous().view(torch.float16).reshape(rows, -1)
    mins = b[..., 2:4].contiguous().view(torch.float16).reshape(rows, -1) if weight.kind == "Q4_1" else None
    start = 4 if weight.kind == "Q4_1" else 2
    quants = b[..., start:].contiguous().reshape(rows, -1)
    assert decode_activations in ACTIVATION_BITS, decode_activations
    return BlockWeight(weight.kind, quants, scales, mins, (rows, cols), kernel, decode_activations)
