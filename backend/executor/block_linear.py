"""Matrices kept in the GGUF file's own blocks (Q4_0, Q4_1, Q8_0), multiplied by the C++ kernel.

The kernel (csrc/block_matmul.cpp, built by block_kernel.py) multiplies with the file's values. From 9
activation rows on (prefill, big batches) it dequantizes each block exactly inside a float32 GEMM, so `linear`
equals `F.linear(x, the file's float32 matrix)` up to summation order (at what dequantizing and calling oneDNN
costs, even at 1,024 rows: docs/benchmarks.md). For 1 to 8 rows (decode steps) a `BlockWeight` chooses between
the same exact float32 product and llama.cpp's: each row quantized to 8 bits per 32 values, integer dot
products with the blocks (csrc/block_int8_dot.cpp). `INT8_DECODE` is that choice. At load the blocks are split
into their quants and their float16 scales (and Q4_1's minimums), the layout the kernel reads; the values stay
the file's.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from backend.executor.quant_blocks import BLOCK, BLOCK_BYTES, BlockQuantized

KINDS = {"Q4_0": 0, "Q4_1": 1, "Q8_0": 2}

# Off: with 8-bit activations a batch-1 step's products ran ~1.8x faster, but the default model's perplexity
# scored one token a step rose 1.5% and greedy answers equal to `none` fell to 5 of 12.
INT8_DECODE = False


@dataclass(slots=True)
class BlockWeight:
    """`[out, in]` weights as uint8 `quants` `[out, in / 2]` (Q4) or `[out, in]` (Q8_0), float16 `scales` and
    (Q4_1) `mins` `[out, in / 32]`, and the kernel that multiplies them; `int8_activations`: 1 to 8 rows are
    quantized to 8 bits for integer products (else multiplied exactly in float32, as more rows always are)."""

    kind: str
    quants: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None
    shape: tuple[int, int]
    kernel: ModuleType
    int8_activations: bool

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.reshape(-1, self.shape[1]).float()
        out = self.kernel.linear(rows, self.quants, self.scales, self.mins, KINDS[self.kind], self.int8_activations)
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
        taken = BlockWeight(self.kind, self.quants[ids], self.scales[ids], mins, shape, self.kernel, False)
        return taken.dequantize().to(dtype)


def from_blocks(weight: BlockQuantized, kernel: ModuleType, int8_activations: bool = INT8_DECODE) -> BlockWeight:
    """Split the file's blocks into the kernel's arrays (the raw bytes moved, no value changed)."""
    rows, cols = weight.shape
    b = weight.blocks.view(rows, cols // BLOCK, BLOCK_BYTES[weight.kind])
    scales = b[..., 0:2].contiguous().view(torch.float16).reshape(rows, -1)
    mins = b[..., 2:4].contiguous().view(torch.float16).reshape(rows, -1) if weight.kind == "Q4_1" else None
    start = 4 if weight.kind == "Q4_1" else 2
    quants = b[..., start:].contiguous().reshape(rows, -1)
    return BlockWeight(weight.kind, quants, scales, mins, (rows, cols), kernel, int8_activations)
