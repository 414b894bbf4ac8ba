"""Scheduler: token budget, decode-first order, chunked prefill, preemption, priorities, queue limits."""

from __future__ import annotations

import pytest

from backend.engine.block_pool import BlockPool
from backend.engine.errors import EngineOverloaded
from backend.engine.sampling_params import SamplingParams
from backend.engine.scheduler import ScheduledBatch, Scheduler
from backend.engine.sequence import FinishReason, Sequence, SequenceStatus


def make_scheduler(num_blocks: int = 64, block_size: int = 4, **kw: int | float) -> Scheduler:
    opts: dict = dict(
        max_num_seqs=8, max_num_batched_tokens=32, max_waiting=16, max_waiting_tokens=10_000, queue_timeout=30.0
    )
    opts.update(kw)
    return Scheduler(BlockPool(num_blocks, block_size), **opts)


def seq(name: str, length: int, priority: int = 0, first: int = 0) -> Sequence:
    return Sequence(name, list(range(first, first + length)), SamplingParams(max_tokens=64), priority=priority)


def step(sched: Scheduler) -> ScheduledBatch:
    """One engine step without a model: write KV, and sample token 1 for sequences that finished prefill."""
    batch = sched.schedule()
    sampling = [s for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True) if s.num_computed_tokens + n == s.num_tokens]
    sched.advance(batch)
    for s in sampling:
        s.token_ids.append(1)
    return batch


def plan(batch: ScheduledBatch) -> dict[str, int]:
    return {s.request_id: n for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)}


def test_long_prompt_is_chunked_by_the_token_budget() -> None:
    sched = make_scheduler(max_num_batched_tokens=16)
    sched.add(seq("long", 40))
    assert [plan(step(sched))["long"] for _ in range(3)] == [16, 16, 8]
    assert plan(step(sched)) == {"long": 1}


def test_decodes_run_before_prefill_chunks_and_share_the_budget() -> None:
    sched = make_scheduler(max_num_batched_tokens=16)
    sched.add(seq("a", 4))
    step(sched)  # a prefilled, now decoding
    sched.add(seq("b", 40, first=100))
    batch = step(sched)
    assert plan(batch) == {"a": 1, "b": 15}
    assert batch.seqs[0].request_id == "a"


def test_max_num_seqs_caps_the_running_set() -> None:
    sched = make_scheduler(max_num_seqs=2)
    for i in range(4):
        sched.add(seq(f"r{i}", 4, first=10 * i))
    assert set(plan(step(sched))) == {"r0", "r1"}
    assert len(sched.waiting) == 2


def test_priority_orders_admission() -> None:
    sched = make_scheduler(max_num_seqs=1)
    sched.add(seq("batch", 4, priority=5))
    sched.add(seq("realtime", 4, priority=0, first=50))
    assert set(plan(step(sched))) == {"realtime"}


def test_out_of_blocks_preempts_the_youngest_and_it_returns_with_its_tokens() -> None:
    # 6 blocks of 4 tokens: two 8-token prompts fit (4 blocks), their decodes soon exhaust the pool.
    sched = make_scheduler(num_blocks=6, block_size=4)
    old, young = seq("old", 8), seq("young", 8, first=50)
    sched.add(old)
    sched.add(young)
    preempted_at = None
    for i in range(12):
        step(sched)
        if young.status is SequenceStatus.WAITING and preempted_at is None:
            preempted_at = i
            assert old.status is SequenceStatus.RUNNING
            assert young.block_table == [] and young.num_computed_tokens == 0
            assert young.num_completion_tokens > 0, "generated tokens survive preemption"
    assert preempted_at is not None
    assert young.timings.num_preemptions >= 1 and sched.num_preemptions >= 1
    sched.finish(old, FinishReason.LENGTH)
    for _ in range(4):
        step(sched)
    assert young.status is SequenceStatus.RUNNING
    sched.pool.check_invariants()


def test_lower_priority_is_preempted_before_a_younger_important_one() -> None:
    sched = make_scheduler(num_blocks=6, block_size=4)
    low, high = seq("low", 8, priority=9), seq("high", 8, priority=0, first=50)
    sched.add(low)
    sched.add(high)
    step(sched)
    assert low.status is SequenceStatus.RUNNING
    while low.status is SequenceStatus.RUNNING:
        step(sched)
    assert high.status is SequenceStatus.RUNNING


def test_preempted_request_returns_only_with_blocks_for_its_whole_prefill() -> None:
    sched = make_scheduler(num_blocks=6, block_size=4)
    a, b = seq("a", 8), seq("b", 8, first=50)
    sched.add(a)
    sched.add(b)
    step(sched)
    while b.status is SequenceStatus.RUNNING:
        step(sched)
    for _ in range(8):
        preemptions = sched.num_preemptions
        batch = step(sched)
        if b in batch.seqs:
            # Admitted with room for every token it holds, and never in a step that had to preempt.
            assert len(b.block_table) * 4 >= b.num_tokens
            assert sched.num_preemptions == preemptions
            return
        if a.num_completion_tokens >= 12:
            sched.finish(a, FinishReason.LENGTH)
    pytest.fail("the preempted request never came back")


def test_waiting_queue_is_bounded_by_count_and_tokens() -> None:
    sched = make_scheduler(max_waiting=2, max_waiting_tokens=100)
    sched.add(seq("a", 10))
    sched.add(seq("b", 10))
    with pytest.raises(EngineOverloaded) as err:
        sched.add(seq("c", 10))
    assert err.value.retry_after > 0
    sched2 = make_scheduler(max_waiting_tokens=15)
    sched2.add(seq("a", 10))
    with pytest.raises(EngineOverloaded):
        sched2.add(seq("b", 10))
    sched2.add(seq("offline", 10), bounded=False)  # batch jobs skip the bounds
    assert len(sched2.waiting) == 2


def test_requests_that_never_start_expire_after_the_queue_timeout() -> None:
    sched = make_scheduler(max_num_seqs=1, queue_timeout=5.0)
    running, stuck = seq("running", 4), seq("stuck", 4, first=50)
    sched.add(running)
    step(sched)
    sched.add(stuck)
    assert sched.expire(stuck.timings.queued + 1.0) == []
    assert sched.expire(stuck.timings.queued + 6.0) == [stuck]
    assert stuck.finish_reason is FinishReason.QUEUE_TIMEOUT and sched.waiting == []
    assert sched.expire(running.timings.queued + 60.0) == [], "started requests never expire"


def test_finish_frees_blocks_for_waiting_and_running_requests() -> None:
    sched = make_scheduler(max_num_seqs=1)
    a, b = seq("a", 10), seq("b", 10, first=50)
    sched.add(a)
    sched.add(b)
    step(sched)
    sched.finish(b, FinishReason.ABORT)
    sched.finish(a, FinishReason.ABORT)
    assert sched.pool.num_free == sched.pool.num_blocks
    assert not sched.has_work and sched.waiting_tokens == 0
