"""Matrices kept in the GGUF file's own blocks (Q4_0, Q4_1, Q5_0, Q8_0), multiplied by the C++ kernel.

The kernel (csrc/block_matmul.cpp, built by block_kernel.py) multiplies with the file's values. From 9
activation rows on (prefill, big batches) it dequantizes each block exactly inside a float32 GEMM, so `linear`
equals `F.linear(x, the file's float32 matrix)` up to summation order (at what dequantizing and calling oneDNN
costs, even at 1,024 rows: docs/benchmarks.md). For 1 to 8 rows (decode steps) a `BlockWeight` chooses between
the same exact float32 product and integer ones in llama.cpp's manner: each row quantized per 32 values to 16
or 8 bits, integer dot products with the blocks (csrc/block_integer_dot.cpp). `DECODE_ACTIVATIONS` is that
choice. On CPUs with AVX-512 VNNI the integer choice holds for any number of rows: many rows run as an integer
GEMM (vpdpwssd for 16 bits, vpdpbusd for 8; csrc/block_gemm.cpp), 1.6x (16 bits) to 2.4x (8 bits) faster than
the float32 GEMM on a Zen 4 core. `TIDEGATE_CPU_ISA=avx2` (or `kernel.set_isa`) keeps the exact float32 GEMM.

At load the blocks are split into their quants and their float16 scales (and Q4_1's minimums) and the output
rows interleaved 8 at a time (`interleave`), the layout the kernel reads: a 16-byte load then holds two values
of each of 8 rows, so an integer product forms 8 rows' sums in one vector. The values stay the file's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

from backend.executor.cpu.quant_blocks import BLOCK, BLOCK_BYTES, BlockQuantized

KINDS = {"Q4_0": 0, "Q4_1": 1, "Q8_0": 2, "Q4_K": 3, "Q5_K": 4, "Q6_K": 5, "Q5_0": 6}  # the K-quants: k_quants.py
GROUP = 8  # output rows interleaved together (csrc/block_format.h)
ACTIVATION_BITS = {"float32": 32, "int16": 16, "int8": 8}

# What the activations of 1 to 8 rows are multiplied as (docs/benchmarks.md, "Integer decode products"):
# int16 makes a batch-1 step's products ~1.7x faster than float32 with the perplexity and the greedy answers
# of `none`; int8 (llama.cpp's) is hardly faster on AVX2 without VNNI and raised the perplexity 1.5%.
DECODE_ACTIVATIONS = "int16"


@dataclass(slots=True)
class BlockWeight:
    """`[out, in]` weights interleaved (`interleave`): uint8 `quants` `[groups, 8 * row bytes]`, float16 `scales`
    and (Q4_1) `mins` `[groups, 8 * in / 32]`, and the kernel that multiplies them; `decode_activations` (a key of
    `ACTIVATION_BITS`): how 1 to 8 rows are multiplied (more rows always exactly, in float32). A K-quant matrix
    (k_quants.py) holds all its bytes in `quants`, and its products are integer ones for any row count."""

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
                                 ACTIVATION_BITS[self.decode_activations], self.shape[0])
        if not plain:
            out = out.to(x.dtype).reshape(*x.shape[:-1], self.shape[0])
        return out if bias is None else out + bias

    def dequantize(self, begin: int = 0, end: int | None = None) -> torch.Tensor:
        """Rows `begin:end` as float32, the file's values exactly."""
        return self.rows(torch.arange(begin, self.shape[0] if end is None else end), torch.float32)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The rows `ids` (an embedding lookup), in `dtype`."""
        rows: torch.Tensor = self.kernel.dequantize(self.quants, self.scales, self.mins, KINDS[self.kind],
                                                    self.shape[0], ids)
        return rows.to(dtype)


def interleave(per_row: torch.Tensor, unit: int, zeros: Callable[[list[int]], torch.Tensor] | None = None
               ) -> torch.Tensor:
    """`[out, blocks, n]` per-row data (quant bytes, or one scale) as `[groups, blocks * 8 * n]`: the rows padded
    with zeros to groups of `GROUP`, and each block's data of a group's rows alternating in units of `unit`;
    written into `zeros(shape)` (uint8 data only) when given, e.g. memory on huge pages."""
    out, blocks, n = per_row.shape
    groups, full = -(-out // GROUP), out // GROUP
    # Written straight into the kernel's order: a padded copy of the rows on the way was one more matrix at load
    # (136 MiB for Qwen2.5-0.5B's Q8_0 vocabulary).
    shape = [groups, blocks, n // unit, GROUP, unit]
    result = torch.zeros(shape, dtype=per_row.dtype) if zeros is None else zeros(shape)
    rows = result.permute(0, 3, 1, 2, 4)  # [groups, GROUP, blocks, n / unit, unit]
    rows[:full] = per_row[: full * GROUP].reshape(full, GROUP, blocks, n // unit, unit)
    if out > full * GROUP:
        rows[full, : out - full * GROUP] = per_row[full * GROUP :].reshape(-1, blocks, n // unit, unit)
    return result.view(groups, -1)


def from_blocks(
    weight: BlockQuantized, kernel: ModuleType, decode_activations: str = DECODE_ACTIVATIONS
) -> BlockWeight:
    """Split the file's blocks into the kernel's interleaved arrays (the raw bytes moved, no value changed)."""
    rows, cols = weight.shape
    b = weight.blocks.view(rows, cols // BLOCK, BLOCK_BYTES[weight.kind])
    scales = interleave(b[..., 0:2].contiguous().view(torch.float16), 1)
    mins = interleave(b[..., 2:4].contiguous().view(torch.float16), 1) if weight.kind == "Q4_1" else None
    # On 2 MB pages: a decode step streams each weight once (csrc/k_blocks.cpp, huge_page_zeros).
    if weight.kind == "Q5_0":  # Q4_0's nibbles, then the mask of fifth bits: the layout csrc/block_format.h reads
        quants = interleave(torch.cat([b[..., 6:], b[..., 2:6]], dim=-1), 2, kernel.huge_page_zeros)
    else:
        quants = interleave(b[..., 4 if weight.kind == "Q4_1" else 2:], 2, kernel.huge_page_zeros)
    assert decode_activations in ACTIVATION_BITS, decode_activations
    return BlockWeight(weight.kind, quants, scales, mins, (rows, cols), kernel, decode_activations)
