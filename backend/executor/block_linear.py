"""Matrices kept in the GGUF file's own blocks (Q4_0, Q4_1, Q8_0), multiplied by the C++ kernel in float32.

The kernel (csrc/block_matmul.cpp, built by block_kernel.py) dequantizes each block exactly inside the product,
so `linear` equals `F.linear(x, the file's float32 matrix)` up to summation order, at every row count (its
GEMM path costs what dequantizing and calling oneDNN costs, even at 1,024 rows: docs/benchmarks.md). At load
the blocks are split into their quants and their float16 scales (and Q4_1's minimums), the layout the kernel
reads; the values stay the file's.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from backend.executor.quant_blocks import BLOCK, BLOCK_BYTES, BlockQuantized

KINDS = {"Q4_0": 0, "Q4_1": 1, "Q8_0": 2}


@dataclass(slots=True)
class BlockWeight:
    """`[out, in]` weights as uint8 `quants` `[out, in / 2]` (Q4) or `[out, in]` (Q8_0), float16 `scales` and
    (Q4_1) `mins` `[out, in / 32]`, and the kernel that multiplies them."""

    kind: str
    quants: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None
    shape: tuple[int, int]
    kernel: ModuleType

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.reshape(-1, self.shape[1]).float()
        out = self.kernel.linear(rows, self.quants, self.scales, self.mins, KINDS[self.kind])
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
        taken = BlockWeight(self.kind, self.quants[ids], self.scales[ids], mins, (len(ids), self.shape[1]), self.kernel)
        return taken.dequantize().to(dtype)


def from_blocks(weight: BlockQuantized, kernel: ModuleType) -> BlockWeight:
    """Split the file's blocks into the kernel's arrays (the raw bytes moved, no value changed)."""
    rows, cols = weight.shape
    b = weight.blocks.view(rows, cols // BLOCK, BLOCK_BYTES[weight.kind])
    scales = b[..., 0:2].contiguous().view(torch.float16).reshape(rows, -1)
    mins = b[..., 2:4].contiguous().view(torch.float16).reshape(rows, -1) if weight.kind == "Q4_1" else None
    start = 4 if weight.kind == "Q4_1" else 2
    quants = b[..., start:].contiguous().reshape(rows, -1)
    return BlockWeight(weight.kind, quants, scales, mins, (rows, cols), kernel)
