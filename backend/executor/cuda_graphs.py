"""CUDA graphs for decode steps: each bucketed batch size is captured once over static buffers and replayed.

The runner replays them for decode-only steps on CUDA (`EngineConfig.cuda_graphs`, on by default). A decode
step of a small batch is bound by kernel launches (about ten per layer), so replaying a captured graph
removes the host from the step. Only graph-safe attention (`TritonAttention`) is captured: the torch
reference plans each step on the host. Prefill and mixed steps run eagerly. Each graph is captured over one
attention plan of the static buffers; rotary reads its full cos/sin table on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.executor.attention.base import AttentionMetadata
from backend.executor.model.model import LlamaModel

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


@dataclass(slots=True)
class _Captured:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # [bucket, vocab] float32, rewritten by every replay


class DecodeGraphs:
    """Decode steps (one new token per sequence) captured at bucketed batch sizes.

    ``replay`` copies a step's inputs into the static buffers, pads the batch up to its bucket with rows that
    write nothing (slot -1) and attend to nothing (context 0), replays, and returns the real rows' logits.
    """

    def __init__(
        self,
        model: LlamaModel,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        *,
        max_batch: int,
        max_blocks_per_seq: int,
        buckets: tuple[int, ...] = DEFAULT_BUCKETS,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = kv_caches[0][0].shape[1]
        dev = kv_caches[0][0].device
        self.input_ids = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((max_batch,), -1, dtype=torch.int64, device=dev)
        self.context_lens = torch.zeros(max_batch, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(max_batch, max_blocks_per_seq, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=dev)
        self.buckets = sorted({b for b in buckets if b < max_batch} | {max_batch})
        self._graphs: dict[int, _Captured] = {}
        self._capture_all()

    def fits(self, batch: int, blocks_per_seq: int) -> bool:
        """Whether a decode step of ``batch`` sequences, the widest holding that many blocks, can replay."""
        return self.bucket_for(batch) is not None and blocks_per_seq <= self.block_tables.shape[1]

    def bucket_for(self, batch: int) -> int | None:
        """The smallest captured size that holds ``batch`` sequences, or None (run eagerly then)."""
        return next((b for b in self.buckets if b >= batch), None)

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Float32 logits ``[n, vocab]`` of a decode step of n sequences; the KV caches are updated."""
        n = input_ids.shape[0]
        bucket = self.bucket_for(n)
        assert bucket is not None and meta.max_query_len == 1, "only decode steps that fit a bucket replay"
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:bucket].fill_(-1)
        self.context_lens[:n].copy_(meta.context_lens)
        self.context_lens[n:bucket].zero_()
        self.block_tables[:n, : meta.block_tables.shape[1]].copy_(meta.block_tables)
        captured = self._graphs[bucket]
        captured.graph.replay()
        return captured.logits[:n]

    def _plan(self, batch: int) -> object:
        """The plan every replay at this size reads: it is built over the static buffers, which replay refills."""
        meta = AttentionMetadata(
            query_start_loc=self.query_start_loc[: batch + 1],
            context_lens=self.context_lens[:batch],
            block_tables=self.block_tables[:batch],
            slot_mapping=self.slot_mapping[:batch],
            max_query_len=1,
            max_context_len=self.block_tables.shape[1] * self.block_size,
        )
        return self.model.ops.attention.plan(meta, self.block_size, self.kv_caches[0][0].dtype)

    def _step(self, batch: int, plan: object) -> torch.Tensor:
        hidden = self.model(self.input_ids[:batch], self.positions[:batch], self.kv_caches, plan)
        return self.model.compute_logits(hidden)

    def _capture_all(self) -> None:
        pool = None
        for batch in reversed(self.buckets):  # largest first, so smaller graphs fit in its memory pool
            plan = self._plan(batch)
            # An eager run first compiles the Triton kernels and settles the allocator, off the capture.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._step(batch, plan)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._step(batch, plan)
            pool = graph.pool()
            self._graphs[batch] = _Captured(graph, logits)
