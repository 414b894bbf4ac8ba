"""Continuous batching: which sequences run in the next step, and how many new tokens each."""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from backend.engine.block_pool import BlockPool
from backend.engine.errors import EngineOverloaded
from backend.engine.sequence import FinishReason, Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledBatch:
    """One step's work: for each sequence, the number of new tokens whose KV it computes."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    """Fills each step up to a token budget: running sequences first (decodes before prefill chunks), then
    waiting ones in priority order. Out of blocks, it preempts the least important running sequence by
    recompute; a preempted sequence returns only when blocks for its whole prefill are free."""

    def __init__(
        self,
        pool: BlockPool,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_waiting: int,
        max_waiting_tokens: int,
        queue_timeout: float,
    ) -> None:
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_waiting = max_waiting
        self.max_waiting_tokens = max_waiting_tokens
        self.queue_timeout = queue_timeout
        self.waiting: list[Sequence] = []  # sorted by sort_key
        self.running: list[Sequence] = []  # sorted by sort_key
        self.waiting_tokens = 0
        self.num_preemptions = 0
        # Headroom kept free when admitting beside running requests, so their decodes do not preempt at once.
        self.watermark = max(1, pool.num_blocks // 100)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence, *, bounded: bool = True) -> None:
        """Queue a new request; raise EngineOverloaded when the waiting queue is full. An unbounded
        (offline) request skips the queue limits and has no queue deadline."""
        if bounded:
            self._check_room(seq)
            seq.queue_deadline = seq.timings.queued + self.queue_timeout
        self._enqueue(seq)

    def _check_room(self, seq: Sequence) -> None:
        if len(self.waiting) >= self.max_waiting:
            raise EngineOverloaded(f"waiting queue is full ({self.max_waiting} requests)", self.retry_after())
        if self.waiting_tokens + seq.num_tokens > self.max_waiting_tokens:
            raise EngineOverloaded(
                f"waiting queue is full ({self.max_waiting_tokens} prompt tokens)", self.retry_after()
            )

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        preempted = False
        # Running sequences: decodes first, then prefill chunks, each group most important first.
        order = sorted(self.running, key=lambda s: (s.num_tokens - s.num_computed_tokens > 1, s.sort_key))
        for seq in order:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            num_new = self._running_tokens(seq, budget)
            while not self.pool.can_grow(seq, seq.num_computed_tokens + num_new):
                victim = self._victim(batch)
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            self.pool.grow(seq, seq.num_computed_tokens + num_new)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        # Waiting sequences, in priority order; none in a step that had to preempt (they would thrash).
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            reserve = self.watermark if self.running else 0
            if not self._admit(seq, reserve):
                break
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        return batch

    def _running_tokens(self, seq: Sequence, budget: int) -> int:
        """A running sequence's new tokens this step: its pending ones, then as many of its draft tokens as
        fit the budget and the free blocks (drafts never preempt anyone)."""
        pending = seq.num_tokens - seq.num_computed_tokens
        draft = seq.draft_token_ids
        # a free block per running sequence stays, so that no decode after this one has to preempt
        if draft and not self.pool.can_grow(seq, seq.num_tokens + len(draft), reserve=len(self.running)):
            draft.clear()
        num_new = min(pending + len(draft), budget)
        del draft[max(0, num_new - pending) :]
        return num_new

    def advance(self, batch: ScheduledBatch) -> None:
        """Record that the batch's KV was written, and publish newly full blocks to the prefix cache."""
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens, strict=True):
            if seq.status is SequenceStatus.RUNNING:
                seq.num_computed_tokens += num_new
                self.pool.cache_full_blocks(seq)

    def fork(self, parent: Sequence) -> None:
        """Start the parent's pending choices now that its prompt's KV is computed: each shares the full
        prompt blocks and recomputes only the prompt's last, partial block (at least its last token, which it
        samples from), so the choices never write into a shared block."""
        shared = (parent.num_prompt_tokens - 1) // self.pool.block_size
        for child in parent.forks:
            if child.status is not SequenceStatus.PENDING:  # aborted before the fork
                continue
            self.pool.fork(parent, child, shared)
            child.status = SequenceStatus.RUNNING
            child.timings.scheduled = time.monotonic()
            child.num_cached_tokens = parent.num_cached_tokens
            bisect.insort(self.running, child, key=lambda s: s.sort_key)
        parent.forks = []

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End a sequence wherever it is and return its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
            self.waiting_tokens -= seq.num_tokens
        elif seq.status is not SequenceStatus.PENDING:
            return
        self.pool.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.timings.finished = time.monotonic()

    def expire(self, now: float) -> list[Sequence]:
        """End the waiting requests that never started within the queue timeout."""
        expired = [
            s
            for s in self.waiting
            if s.timings.scheduled is None and s.queue_deadline is not None and now > s.queue_deadline
        ]
        for seq in expired:
            self.finish(seq, FinishReason.QUEUE_TIMEOUT)
            for choice in seq.forks:
                self.finish(choice, FinishReason.QUEUE_TIMEOUT)
        return expired

    def preempt(self, seq: Sequence) -> None:
        """Free a running sequence's blocks and requeue it; its KV is recomputed when it returns."""
        self.running.remove(seq)
        self.pool.free(seq)
        seq.draft_token_ids = []
        seq.timings.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(seq)

    def _admit(self, seq: Sequence, reserve: int) -> bool:
        if not self.pool.allocate(seq, reserve):
            return False
        self.waiting.pop(0)
        self.waiting_tokens -= seq.num_tokens
        seq.status = SequenceStatus.RUNNING
        if seq.timings.scheduled is None:
            seq.timings.scheduled = time.monotonic()
            seq.num_cached_tokens = seq.num_computed_tokens
        bisect.insort(self.running, seq, key=lambda s: s.sort_key)
        return True

    def _victim(self, batch: ScheduledBatch) -> Sequence:
        """The least important running sequence not already in this step's batch."""
        scheduled = {id(s) for s in batch.seqs}
        for seq in reversed(self.running):
            if id(seq) not in scheduled:
                return seq
        raise AssertionError("no running sequence to preempt")  # the current one is never scheduled yet

    def _enqueue(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=lambda s: s.sort_key)
        self.waiting_tokens += seq.num_tokens

    def retry_after(self) -> float:
        """Seconds a refused caller should wait before trying again."""
        return max(1.0, min(self.queue_timeout, 5.0))
