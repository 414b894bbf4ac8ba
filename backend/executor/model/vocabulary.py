"""The quantized token table: the embedding's rows and the output head's product, one copy when they are tied.

Where the file holds the table in Q4_0/Q4_1/Q8_0 blocks and the block kernel builds (block_kernel.py), both run
on those blocks: the head's product is that of any block matrix (block_linear.py: the file's values, decode
rows with 16-bit activations) and the embedding dequantizes the file's rows exactly.

Elsewhere the head's product over the whole vocabulary runs on int8 weights with bfloat16 activations and
results (quantized_linear.py); bfloat16 keeps 8 bits of a logit, 0.125 apart near 20, which makes ties of
tokens that float32 tells apart. So the few leading candidates of each row are recomputed in float32 from the
file's own rows, and the greedy choice (and the top of any sampled one) is then that of the float model up to
its inputs. The embedding looks up the same exact rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.executor.cpu.block_linear import BlockWeight
from backend.executor.cpu.quant_blocks import BlockQuantized, Weight
from backend.executor.model.quantized_linear import Int8Weight, form_for, quantize, quantize_int8

REFINED = 16  # candidates per row recomputed in float32: far more than bfloat16's rounding can reorder


@dataclass(slots=True)
class Vocabulary:
    """`table` for the product over every token; `exact`: the file's quantized rows beside an int8 table."""

    table: Int8Weight | BlockWeight
    exact: BlockQuantized | None

    @property
    def shape(self) -> tuple[int, int]:
        return self.table.shape

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The embedding rows of `ids`, in `dtype`."""
        if self.exact is None:
            return self.table.rows(ids, dtype)
        return self.exact.take_rows(ids).dequantize().to(dtype)

    def linear(self, hidden: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """Logits `[R, vocab]` in float32: the block product, else the leading `REFINED` of each row in float32."""
        assert bias is None, "a vocabulary head has no bias"
        logits = self.table.linear(hidden).float()
        if isinstance(self.table, BlockWeight):
            return logits
        top = logits.topk(min(REFINED, logits.shape[-1]), dim=-1).indices
        rows = self.rows(top.flatten(), torch.float32).view(*top.shape, -1)
        exact = torch.bmm(rows, hidden.float().unsqueeze(-1)).squeeze(-1)
        return logits.scatter_(-1, top, exact)


def vocabulary_for(weight: Weight) -> Vocabulary:
    """The file's blocks for the kernel wherever `auto` keeps them, whatever the mode; else int8 (the embedding
    reads rows, and int8 keeps one scale per row), with the file's own rows kept to recompute the leading logits."""
    if form_for("auto", weight) == "blocks":
        table = quantize(weight, "blocks")
        assert isinstance(table, BlockWeight)
        return Vocabulary(table, None)
    return Vocabulary(quantize_int8(weight), weight if isinstance(weight, BlockQuantized) else None)
