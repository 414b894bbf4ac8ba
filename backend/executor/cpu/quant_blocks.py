"""GGML's 32-value weight blocks (Q4_0, Q4_1, Q8_0), kept as the file stores them until the model packs them.

A row of a `[out, in]` matrix is `in / 32` blocks, each a float16 scale `d` (Q4_1 also a float16 minimum `m`)
and 32 quants: Q4_0 `w = d * (q - 8)`, Q4_1 `w = d * q + m` (q in 0..15, low nibbles first), Q8_0 `w = d * q`
(q a signed byte). Rows are independent, so merging projections and undoing llama.cpp's head permutation
work on the raw bytes of whole rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


@dataclass(slots=True)
class BlockQuantized:
    """One matrix in a GGML block format: `blocks` is uint8 `[rows, in / 32 * BLOCK_BYTES[kind]]`."""

    kind: str
    blocks: torch.Tensor
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        assert self.kind in BLOCK_BYTES, self.kind
        rows, cols = self.shape
        assert cols % BLOCK == 0 and tuple(self.blocks.shape) == (rows, cols // BLOCK * BLOCK_BYTES[self.kind])

    def take_rows(self, ids: torch.Tensor) -> BlockQuantized:
        """The matrix of rows `ids` (a permutation of the rows, or an embedding lookup's token ids)."""
        return BlockQuantized(self.kind, self.blocks[ids].contiguous(), (len(ids), self.shape[1]))

    def quants(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """`(q, d, m)`: quants `[rows, in]` as int32 (0..15 for Q4, -128..127 for Q8_0), block scales and
        (Q4_1 only) block minimums `[rows, in / 32]` as float32."""
        rows, cols = self.shape
        b = self.blocks.view(rows, cols // BLOCK, BLOCK_BYTES[self.kind])
        d = b[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
        if self.kind == "Q8_0":
            return b[..., 2:].contiguous().view(torch.int8).reshape(rows, cols).int(), d, None
        m = b[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float() if self.kind == "Q4_1" else None
        nibbles = b[..., 4:] if self.kind == "Q4_1" else b[..., 2:]
        q = torch.cat([nibbles & 15, nibbles >> 4], dim=-1).reshape(rows, cols).int()
        return q, d, m

    def dequantize(self) -> torch.Tensor:
        """The float32 matrix the file holds, exactly."""
        q, d, m = self.quants()
        rows, cols = self.shape
        groups = q.view(rows, cols // BLOCK, BLOCK).float()
        if self.kind == "Q4_0":
            groups = groups - 8
        w = groups * d.unsqueeze(-1)
        if m is not None:
            w = w + m.unsqueeze(-1)
        return w.reshape(rows, cols)


Weight = torch.Tensor | BlockQuantized


def concat_rows(parts: list[Weight]) -> Weight:
    """Stack matrices along their rows (merged projections); blocks of one kind stay blocks, else float32."""
    first = parts[0]
    if isinstance(first, BlockQuantized) and all(
        isinstance(p, BlockQuantized) and p.kind == first.kind for p in parts
    ):
        blocks = [p.blocks for p in parts if isinstance(p, BlockQuantized)]
        rows = sum(b.shape[0] for b in blocks)
        return BlockQuantized(first.kind, torch.cat(blocks), (rows, first.shape[1]))
    return torch.cat([as_float(p) for p in parts])


def as_float(weight: Weight) -> torch.Tensor:
    return weight.dequantize() if isinstance(weight, BlockQuantized) else weight


def weight_shape(weight: Weight) -> tuple[int, ...]:
    return weight.shape if isinstance(weight, BlockQuantized) else tuple(weight.shape)
