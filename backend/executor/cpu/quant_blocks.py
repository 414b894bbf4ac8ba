"""GGML's weight blocks, kept as the file stores them until the model packs them: the 32-value kinds (Q4_0, Q4_1,
Q5_0, Q8_0) and the K-quants' 256-value super-blocks (Q4_K, Q5_K, Q6_K; their fields: k_quants.py).

A row of a `[out, in]` matrix is `in / 32` blocks, each a float16 scale `d` (Q4_1 also a float16 minimum `m`)
and 32 quants: Q4_0 `w = d * (q - 8)`, Q4_1 `w = d * q + m` (q in 0..15, low nibbles first), Q8_0 `w = d * q`
(q a signed byte). Rows are independent, so merging projections and undoing llama.cpp's head permutation
work on the raw bytes of whole rows.

Q5_0 is `w = d * (q - 16)`, q in 0..31: a float16 scale, a 32-bit mask of fifth bits (bit j: value j's), then
Q4_0's nibbles; 5.5 bits per weight. llama.cpp's Q4_K_M files put it where a row is no multiple of 256 (all of
Qwen2.5-0.5B's 896-wide matrices).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

log = logging.getLogger(__name__)

BLOCK = 32
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q8_0": 34, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
K_KINDS = ("Q4_K", "Q5_K", "Q6_K")
OFFSETS = {"Q4_0": 8, "Q5_0": 16}  # w = d * (q - offset)
SUPER = 256  # values of a K-quant super-block
BLOCK_VALUES = {kind: SUPER if kind in K_KINDS else BLOCK for kind in BLOCK_BYTES}


@dataclass(slots=True)
class BlockQuantized:
    """One matrix in a GGML block format: `blocks` is uint8 `[rows, in / BLOCK_VALUES[kind] * BLOCK_BYTES[kind]]`."""

    kind: str
    blocks: torch.Tensor
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        assert self.kind in BLOCK_BYTES, self.kind
        rows, cols = self.shape
        values = BLOCK_VALUES[self.kind]
        assert cols % values == 0 and tuple(self.blocks.shape) == (rows, cols // values * BLOCK_BYTES[self.kind])

    def take_rows(self, ids: torch.Tensor) -> BlockQuantized:
        """The matrix of rows `ids` (a permutation of the rows, or an embedding lookup's token ids)."""
        return BlockQuantized(self.kind, self.blocks[ids].contiguous(), (len(ids), self.shape[1]))

    def quants(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """`(q, d, m)`: quants `[rows, in]` as int32 (0..15 for Q4, 0..31 for Q5_0, -128..127 for Q8_0), block
        scales and (Q4_1 only) block minimums `[rows, in / 32]` as float32. The 32-value kinds only."""
        assert self.kind not in K_KINDS, self.kind
        rows, cols = self.shape
        b = self.blocks.view(rows, cols // BLOCK, BLOCK_BYTES[self.kind])
        d = b[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
        if self.kind == "Q8_0":
            return b[..., 2:].contiguous().view(torch.int8).reshape(rows, cols).int(), d, None
        m = b[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float() if self.kind == "Q4_1" else None
        nibbles = b[..., {"Q4_1": 4, "Q5_0": 6}.get(self.kind, 2):]
        q = torch.cat([nibbles & 15, nibbles >> 4], dim=-1).int()
        if self.kind == "Q5_0":
            mask = b[..., 2:6].contiguous().view(torch.int32)  # [rows, blocks, 1]: bit j is value j's fifth bit
            q = q | (((mask >> torch.arange(32, dtype=torch.int32)) & 1) << 4)
        return q.reshape(rows, cols), d, m

    def dequantize(self) -> torch.Tensor:
        """The float32 matrix the file holds, exactly."""
        if self.kind in K_KINDS:  # the gguf package's reference, which defines the format
            values = gguf_dequantize(self.blocks.numpy(), GGMLQuantizationType[self.kind])
            return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(self.shape)
        q, d, m = self.quants()
        rows, cols = self.shape
        groups = q.view(rows, cols // BLOCK, BLOCK).float()
        groups = groups - OFFSETS.get(self.kind, 0)
        w = groups * d.unsqueeze(-1)
        if m is not None:
            w = w + m.unsqueeze(-1)
        return w.reshape(rows, cols)


@dataclass(slots=True)
class MixedRows:
    """Block matrices of different kinds stacked along their rows (a merged projection whose parts the file keeps
    in different types: Q4_K_M stores V and some down projections in Q6_K, Q and K in Q4_K); each part keeps its
    own blocks and its own product."""

    parts: list[BlockQuantized]

    @property
    def shape(self) -> tuple[int, int]:
        return sum(p.shape[0] for p in self.parts), self.parts[0].shape[1]

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])


Weight = torch.Tensor | BlockQuantized | MixedRows


def concat_rows(parts: list[Weight]) -> Weight:
    """Stack matrices along their rows (merged projections): blocks of one kind stay blocks, blocks of several
    kinds stay each in its own blocks (`MixedRows`), anything else becomes float32."""
    blocks = [p for p in parts if isinstance(p, BlockQuantized)]
    if len(blocks) < len(parts):
        if blocks:
            log.warning("a merged matrix of %s and float parts is dequantized: float parts have no block product",
                        ", ".join(sorted({b.kind for b in blocks})))
        return torch.cat([as_float(p) for p in parts])
    if any(b.kind != blocks[0].kind for b in blocks):
        return MixedRows(_merge_runs(blocks))
    rows = sum(b.shape[0] for b in blocks)
    return BlockQuantized(blocks[0].kind, torch.cat([b.blocks for b in blocks]), (rows, blocks[0].shape[1]))


def _merge_runs(blocks: list[BlockQuantized]) -> list[BlockQuantized]:
    """Neighbouring parts of one kind merged (Q and K of Q4_K_M: one product, V another)."""
    runs: list[BlockQuantized] = []
    for b in blocks:
        if runs and runs[-1].kind == b.kind:
            last = runs.pop()
            b = BlockQuantized(b.kind, torch.cat([last.blocks, b.blocks]), (last.shape[0] + b.shape[0], b.shape[1]))
        runs.append(b)
    return runs


def as_float(weight: Weight) -> torch.Tensor:
    return weight if isinstance(weight, torch.Tensor) else weight.dequantize()


def weight_shape(weight: Weight) -> tuple[int, ...]:
    return tuple(weight.shape)
