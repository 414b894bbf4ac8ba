"""The quantized token table: the embedding's rows and the output head's product, one copy when they are tied.

The head's product over the whole vocabulary runs on int8 weights with bfloat16 activations and results
(quantized_linear.py); bfloat16 keeps 8 bits of a logit, 0.125 apart near 20, which makes ties of tokens that
float32 tells apart. So the few leading candidates of each row are recomputed in float32 from the file's own
rows, and the greedy choice (and the top of any sampled one) is then that of the float model up to its
inputs. The embedding looks up the same exact rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.executor.quant_blocks import BlockQuantized
from backend.executor.quantized_linear import Int8Weight

REFINED = 16  # candidates per row recomputed in float32: far more than bfloat16's rounding can reorder


@dataclass(slots=True)
class Vocabulary:
    """`table` for the product over every token; `exact`: the file's quantized rows, when it had them."""

    table: Int8Weight
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
        """Logits `[R, vocab]` in float32, the leading `REFINED` of each row computed in float32."""
        assert bias is None, "a vocabulary head has no bias"
        logits = self.table.linear(hidden).float()
        top = logits.topk(min(REFINED, logits.shape[-1]), dim=-1).indices
        rows = self.rows(top.flatten(), torch.float32).view(*top.shape, -1)
        exact = torch.bmm(rows, hidden.float().unsqueeze(-1)).squeeze(-1)
        return logits.scatter_(-1, top, exact)
