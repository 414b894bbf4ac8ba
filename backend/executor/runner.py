"""Runs one scheduled step through the model: builds the step's index tensors, owns the KV cache."""

from __future__ import annotations

import array
import logging
import math
import mmap
from collections import abc
from dataclasses import dataclass

import torch

from backend.executor.attention.base import AttentionMetadata
from backend.executor.cuda_graphs import DecodeGraphs
from backend.executor.model.config import ModelConfig
from backend.executor.model.model import LlamaModel
from backend.executor.sample.batch import StepBatch as ScheduledBatch
from backend.executor.sample.batch import StepSequence as Sequence

log = logging.getLogger(__name__)
_TYPECODES = {torch.int32: "i", torch.int64: "q"}  # array's 4- and 8-byte signed integers


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
        dtype: torch.dtype = torch.float32,  # the cache's, which may differ from the weights'
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
        graph_safe = model.ops.attention.graph_safe and all(layer.GRAPH_SAFE for layer in model.layers)
        if cuda_graph_batch > 0 and self.device.type == "cuda" and graph_safe:
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
        step = StepInputs.build(seqs, counts, self.block_size)
        device = self.device

        def tensor(values: list[int], dtype: torch.dtype) -> torch.Tensor:
            if not values:  # a step of prefill chunks only samples no row; frombuffer refuses an empty buffer
                return torch.empty(0, dtype=dtype, device=device)
            # through an array's buffer: a third of what torch.tensor(list) costs, ~3 us for a short list
            return torch.frombuffer(array.array(_TYPECODES[dtype], values), dtype=dtype).to(device)

        meta = AttentionMetadata(
            query_start_loc=tensor(step.query_start_loc, torch.int32),
            context_lens=tensor(step.context_lens, torch.int32),
            block_tables=tensor(step.block_tables, torch.int32).view(len(seqs), -1),
            slot_mapping=tensor(step.slots, torch.int64),
            max_query_len=max(counts),
            max_context_len=max(step.context_lens),
        )
        ids, positions = tensor(step.input_ids, torch.int64), tensor(step.positions, torch.int64)
        # a step whose every token samples (all decodes) takes the logits of the whole hidden state as it is
        rows = None if len(step.logits_rows) == len(step.input_ids) else tensor(step.logits_rows, torch.int64)
        graphs = self.graphs
        if graphs is not None and max(counts) == 1 and graphs.fits(len(seqs), step.widest):
            logits = graphs.replay(ids, positions, meta)  # the graph's buffer, which the next replay rewrites
            return (logits.clone() if rows is None else logits[rows]), [seqs[i] for i in step.sampling]
        plan = self.model.ops.attention.plan(meta, self.block_size, self.dtype)  # one for all the layers
        hidden = self.model(ids, positions, self.kv_caches, plan)
        logits = self.model.compute_logits(hidden if rows is None else hidden[rows])
        return logits, [seqs[i] for i in step.sampling]


@dataclass(slots=True)
class StepInputs:
    """A step's index inputs as plain lists, built in one pass over its sequences: a few Python operations per
    sequence and per block, where the same built with torch ops cost some twenty small ops per step."""

    input_ids: list[int]
    positions: list[int]  # absolute position of each new token
    slots: list[int]  # the cache slot each new token writes: block id x block size + offset
    query_start_loc: list[int]  # [S + 1] cumulative new tokens per sequence
    context_lens: list[int]  # [S] tokens of context after the step
    block_tables: list[int]  # [S x widest] each sequence's blocks, padded with 0
    widest: int
    sampling: list[int]  # the sequences that sample: their last pending token is in the step
    logits_rows: list[int]  # the rows they sample from: one each, or 1 + k after k drafts

    @classmethod
    def build(cls, seqs: abc.Sequence[Sequence], counts: list[int], block_size: int) -> StepInputs:
        widest = max(len(s.block_table) for s in seqs)
        step = cls([], [], [], [0], [], [], widest, [], [])
        for i, (seq, n) in enumerate(zip(seqs, counts, strict=True)):
            start, end, draft = seq.num_computed_tokens, seq.num_computed_tokens + n, seq.draft_token_ids
            step.input_ids += (seq.token_ids[start:] + draft)[:n] if draft else seq.token_ids[start:end]
            step.positions += range(start, end)
            table = seq.block_table
            pos = start
            while pos < end:  # the slots block by block: each block's run of offsets is one range
                block, offset = divmod(pos, block_size)
                run = min(block_size - offset, end - pos)
                first = table[block] * block_size + offset
                step.slots += range(first, first + run)
                pos += run
            step.block_tables += table
            step.block_tables += [0] * (widest - len(table))
            step.context_lens.append(end)
            step.query_start_loc.append(step.query_start_loc[-1] + n)
            # Only a sequence whose last pending token is in this step samples; mid-prefill chunks do not. A
            # drafted sequence samples after its last token and after each draft token: 1 + k rows, in order.
            if end == seq.num_tokens + len(draft):
                step.sampling.append(i)
                last = step.query_start_loc[-1]
                step.logits_rows += range(last - 1 - len(draft), last)
        return step
