"""Float32 matrix products on CPU through oneDNN, with each weight matrix packed once at load.

oneDNN's kernels read a weight reordered into their blocked layout; MKL's `F.linear` reads the plain
row-major one. On the 2-core AVX-512 machine of docs/benchmarks.md the packed products ran 1.3x to 3x
faster, in the same float32 arithmetic (only the summation order differs), most of all for the few-row
products of decode steps and for the tall vocabulary head. These are the ops `torch.compile` emits for
frozen CPU linears; where the build has no oneDNN the model keeps `F.linear`.
"""

from __future__ import annotations

import torch

_BATCH_HINT = 64  # the row count oneDNN tunes its packing for; any row count works


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The `[out, in]` weight in oneDNN's layout (an opaque tensor, usable only by `linear` below)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_size=_BATCH_HINT)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for a weight packed by `pack` (a plain one works too, reordered per call)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
