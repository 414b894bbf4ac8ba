"""The C++ decode attention (csrc/paged_attention.cpp), which reads each sequence's keys and values from the
paged cache in place, through its block table, instead of gathering them into a buffer first; and the C++
write of a step's new keys and values into that cache.

It is built into the same extension as the block kernel (block_kernel.py) and registered as
`torch.ops.tidegate.paged_attention`. It serves float32 queries over float32, float16 or bfloat16 caches on the
CPU, for sequences with a few new tokens each (decodes, and the 1 + k rows of a speculative verification, causal
over the drafts).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from backend.executor.cpu import block_kernel

# Sequences with at most this many new tokens go through the kernel; longer prefill chunks keep SDPA, whose
# matrix-matrix products suit them better.
MAX_QUERY_TOKENS = 16
CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(slots=True)
class KernelRows:
    """The sequences of one step that the kernel attends, as int32 tensors it reads on the host."""

    starts: torch.Tensor  # [m] first row of each sequence's new tokens in the step
    q_lens: torch.Tensor  # [m] its new tokens
    context_lens: torch.Tensor  # [m] its context after the step
    block_tables: torch.Tensor  # [m, max_blocks] its blocks


@functools.cache
def available() -> bool:
    """Whether the kernel built and registered its op (where the block kernel cannot build, neither can it)."""
    return block_kernel.has_op("paged_attention")


def serves(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernel can take a step's short sequences: a cache of `dtype` it reads, metadata on the CPU
    (`device`), and a built kernel."""
    return dtype in CACHE_DTYPES and device.type == "cpu" and available()


def rows_for(context_lens: torch.Tensor, block_tables: torch.Tensor, seqs: list[int], starts: list[int],
             q_lens: list[int]) -> KernelRows:
    """The kernel's view of sequences `seqs` of a step whose sequences have `context_lens` and `block_tables`
    (the attention metadata's), given their first rows `starts` and their `q_lens` tokens."""
    if len(seqs) != context_lens.numel():
        idx = torch.tensor(seqs, dtype=torch.long)
        context_lens, block_tables = context_lens.index_select(0, idx), block_tables.index_select(0, idx)
    return KernelRows(
        torch.tensor(starts, dtype=torch.int32),
        torch.tensor(q_lens, dtype=torch.int32),
        context_lens.to(torch.int32).contiguous(),
        block_tables.to(torch.int32).contiguous(),
    )


def attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor, rows: KernelRows, scale: float
) -> None:
    """Write into `out` the attention of the rows' queries over their sequences' cached contexts (the kernel's
    rows only: `out`'s other rows keep their values)."""
    if q.dtype == torch.float32:
        torch.ops.tidegate.paged_attention(
            q, k_cache, v_cache, out, rows.starts, rows.q_lens, rows.context_lens, rows.block_tables, scale
        )
        return
    # 16-bit weights on the CPU: the kernel computes in float32 anyway; widening is exact, so other rows survive.
    wide = out.float()
    attend(q.float(), k_cache, v_cache, wide, rows, scale)
    out.copy_(wide)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Write the step's new keys and values `[T, kv_heads, head_dim]` into the caches at `slots` (-1: not written)."""
    torch.ops.tidegate.write_kv(k.float(), v.float(), k_cache, v_cache, slots)
