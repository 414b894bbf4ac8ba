"""Runs one scheduled step through the model: builds the step's index tensors, owns the KV cache."""

from __future__ import annotations

import logging
import math
import mmap

import torch

from backend.executor.attention import AttentionMetadata
from backend.executor.batch import StepBatch as ScheduledBatch
from backend.executor.batch import StepSequence as Sequence
from backend.executor.cuda_graphs import DecodeGraphs
from backend.executor.model import LlamaModel
from backend.executor.model_config import ModelConfig

log = logging.getLogger(__name__)


def kv_block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, keys and values."""
    element = torch.empty(0, dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * element


def _zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """Zeros; on CPU in an anonymous mapping, which the kernel zero-fills page by page as it is first written,
    so that a replica holds in memory only the part of its KV pool that has been used."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)


class ModelRunner:
    """Owns the per-layer KV cache tensors `[num_blocks, block_size, kv_heads, head_dim]` and runs steps."""

    def __init__(
        self,
        model: LlamaModel,
        num_blocks: int,
        block_size: int,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        cuda_graph_batch: int = 0,
        max_blocks_per_seq: int = 0,
    ) -> None:
        """`cuda_graph_batch` > 0 captures decode steps of up to that many sequences (each with at most
        `max_blocks_per_seq` blocks) as CUDA graphs, when the device is CUDA and the attention is graph-safe."""
        config = model.config
        self.model = model
        self.block_size = block_size
        self.device = torch.device(device)
        self.dtype = dtype
        shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
        self.kv_caches = [
            (_zeroed(shape, dtype, device), _zeroed(shape, dtype, device)) for _ in range(config.num_layers)
        ]
        self.graphs: DecodeGraphs | None = None
        if cuda_graph_batch > 0 and self.device.type == "cuda" and model.ops.attention.graph_safe:
            try:
                self.graphs = DecodeGraphs(
                    model, self.kv_caches, max_batch=cuda_graph_batch, max_blocks_per_seq=max_blocks_per_seq
                )
            except Exception:  # serve eagerly rather than not at all; the log says why
                log.exception("CUDA graph capture failed; decode steps run eagerly")

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> tuple[torch.Tensor, list[Sequence]]:
        """Compute the batch's new tokens; return float32 logits (on the device) for the sequences that sample:
        one row each, or 1 + k rows for a sequence with k draft tokens."""
        seqs, counts = batch.seqs, batch.num_new_tokens
        starts = [s.num_computed_tokens for s in seqs]
        drafts = [s.draft_token_ids for s in seqs]
        input_ids: list[int] = []
        for seq, start, n, draft in zip(seqs, starts, counts, drafts, strict=True):
            tokens = seq.token_ids + draft if draft else seq.token_ids
            input_ids.extend(tokens[start : start + n])
        widest = max(len(s.block_table) for s in seqs)
        flat_tables: list[int] = []
        for seq in seqs:
            flat_tables += seq.block_table
            flat_tables += [0] * (widest - len(seq.block_table))

        q_lens = torch.tensor(counts, dtype=torch.int64)
        computed = torch.tensor(starts, dtype=torch.int64)
        query_start_loc = torch.zeros(len(seqs) + 1, dtype=torch.int64)
        torch.cumsum(q_lens, 0, out=query_start_loc[1:])
        context_lens = computed + q_lens
        # Per new token: its sequence, its absolute position, and the cache slot it writes.
        owner = torch.repeat_interleave(torch.arange(len(seqs)), q_lens)
        positions = torch.arange(len(input_ids)) - query_start_loc[owner] + computed[owner]
        block_tables = torch.tensor(flat_tables, dtype=torch.int32).view(len(seqs), widest)
        slots = block_tables[owner, positions // self.block_size].long() * self.block_size
        slots += positions % self.block_size

        meta = AttentionMetadata(
            query_start_loc=query_start_loc.to(self.device, torch.int32),
            context_lens=context_lens.to(self.device, torch.int32),
            block_tables=block_tables.to(self.device),
            slot_mapping=slots.to(self.device),
            max_query_len=max(counts),
            max_context_len=int(context_lens.max()),
        )
        ids = torch.tensor(input_ids, dtype=torch.int64, device=self.device)
        # Only a sequence whose last pending token is in this step samples; mid-prefill chunks do not. A
        # drafted sequence samples after its last token and after each draft token: 1 + k rows, in order.
        sampling = [i for i, seq in enumerate(seqs) if starts[i] + counts[i] == seq.num_tokens + len(drafts[i])]
        ends = query_start_loc[1:].tolist()
        rows = torch.tensor([r for i in sampling for r in range(ends[i] - 1 - len(drafts[i]), ends[i])],
                            dtype=torch.int64, device=self.device)
        graphs = self.graphs
        if graphs is not None and max(counts) == 1 and graphs.fits(len(seqs), widest):
            logits = graphs.replay(ids, positions.to(self.device), meta)[rows]
        else:
            plan = self.model.ops.attention.plan(meta, self.block_size, self.dtype)  # one for all the layers
            hidden = self.model(ids, positions.to(self.device), self.kv_caches, plan)
            logits = self.model.compute_logits(hidden[rows])
        return logits, [seqs[i] for i in sampling]
