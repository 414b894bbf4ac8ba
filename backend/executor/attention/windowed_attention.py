"""Attention with what the fast paths lack: a sliding window per layer and soft-capped logits (Gemma 2/3).

The reference form, one sequence at a time in torch: every layer keeps its full KV in the paged cache (so the
prefix cache and speculation see the same blocks as for any model) and a window is a mask, not eviction.
It reads the step's metadata on the host, so it is never captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.executor.attention.base import AttentionMetadata


@dataclass(slots=True)
class SequenceRows:
    start: int  # first row of the step's batch
    end: int
    context_len: int
    blocks: torch.Tensor  # the blocks holding the context, in order


@dataclass(slots=True)
class WindowedPlan:
    sequences: list[SequenceRows]
    written_rows: torch.Tensor  # rows with a slot (not padding)
    slots: torch.Tensor  # their slots


class WindowedAttention:
    graph_safe = False

    def plan(self, meta: AttentionMetadata, block_size: int, dtype: torch.dtype) -> WindowedPlan:
        starts = meta.query_start_loc.tolist()
        lens = meta.context_lens.tolist()
        sequences = [
            SequenceRows(starts[i], starts[i + 1], lens[i], meta.block_tables[i, : -(-lens[i] // block_size)])
            for i in range(len(lens)) if starts[i + 1] > starts[i]
        ]
        rows = (meta.slot_mapping >= 0).nonzero().squeeze(1)
        return WindowedPlan(sequences, rows, meta.slot_mapping.index_select(0, rows))

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 plan: WindowedPlan) -> None:
        kvh, d = k_cache.shape[2], k_cache.shape[3]
        rows = plan.written_rows
        k_cache.view(-1, kvh, d).index_copy_(0, plan.slots, k.index_select(0, rows).to(k_cache.dtype))
        v_cache.view(-1, kvh, d).index_copy_(0, plan.slots, v.index_select(0, rows).to(v_cache.dtype))

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: WindowedPlan,
               scale: float) -> torch.Tensor:
        return self.attend_with(q, k_cache, v_cache, plan, scale)

    def attend_with(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: WindowedPlan,
                    scale: float, *, softcap: float | None = None, window: int | None = None) -> torch.Tensor:
        """Causal attention where query position i sees keys j with `i - j < window`, its logits
        `softcap * tanh(logits / softcap)` (as transformers' eager attention), in float32."""
        kvh, d = k_cache.shape[2], k_cache.shape[3]
        group = q.shape[1] // kvh
        out = torch.zeros_like(q)
        for seq in plan.sequences:
            n, length = seq.end - seq.start, seq.context_len
            k = k_cache.index_select(0, seq.blocks).reshape(-1, kvh, d)[:length].float().repeat_interleave(group, 1)
            v = v_cache.index_select(0, seq.blocks).reshape(-1, kvh, d)[:length].float().repeat_interleave(group, 1)
            scores = torch.einsum("nhd,lhd->hnl", q[seq.start : seq.end].float(), k) * scale
            if softcap is not None:
                scores = torch.tanh(scores / softcap) * softcap
            q_pos = torch.arange(length - n, length, device=q.device).unsqueeze(1)
            k_pos = torch.arange(length, device=q.device).unsqueeze(0)
            visible = k_pos <= q_pos
            if window is not None:
                visible &= q_pos - k_pos < window
            scores = scores.masked_fill(~visible, float("-inf")).softmax(-1)
            out[seq.start : seq.end] = torch.einsum("hnl,lhd->nhd", scores, v).to(q.dtype)
        return out
