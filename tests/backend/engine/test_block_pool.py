"""Block pool: allocation, prefix sharing, refcounts, LRU eviction, and invariants under random orders."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.engine.block_pool import BlockPool
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Sequence


def make_seq(tokens: list[int], salt: str | None = None) -> Sequence:
    return Sequence(f"r{tokens[:3]}", tokens, SamplingParams(), cache_salt=salt)


def run_prefill(pool: BlockPool, seq: Sequence) -> None:
    """What a step does after the model wrote the prompt's KV."""
    seq.num_computed_tokens = seq.num_tokens
    pool.cache_full_blocks(seq)


def test_allocate_gives_blocks_for_every_token_and_free_returns_them() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    seq = make_seq(list(range(10)))
    assert pool.allocate(seq)
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert pool.num_free == 5
    pool.free(seq)
    assert pool.num_free == 8 and seq.block_table == []
    pool.check_invariants()


def test_allocate_refuses_when_blocks_do_not_fit_and_changes_nothing() -> None:
    pool = BlockPool(num_blocks=2, block_size=4)
    seq = make_seq(list(range(9)))
    assert not pool.allocate(seq)
    assert pool.num_free == 2 and seq.block_table == []
    assert pool.prefix_queries == 0


def test_shared_prefix_reuses_full_blocks_but_recomputes_the_last_token() -> None:
    pool = BlockPool(num_blocks=16, block_size=4)
    first = make_seq(list(range(12)))
    assert pool.allocate(first)
    run_prefill(pool, first)
    # Same 12 tokens: only 2 of 3 full blocks may hit, since the last prompt token is always recomputed.
    same = make_seq(list(range(12)))
    assert pool.allocate(same)
    assert same.num_computed_tokens == 8
    assert same.block_table[:2] == first.block_table[:2]
    assert same.block_table[2] != first.block_table[2]
    longer = make_seq([*range(12), 99, 98])
    assert pool.allocate(longer)
    assert longer.num_computed_tokens == 12
    assert longer.block_table[:3] == first.block_table
    assert pool.blocks[first.block_table[0]].ref_count == 3
    pool.check_invariants()


def test_prefix_hit_needs_the_whole_chain_not_just_the_block() -> None:
    pool = BlockPool(num_blocks=16, block_size=4)
    first = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert pool.allocate(first)
    run_prefill(pool, first)
    # Same second block, different first block: no hit anywhere.
    other = make_seq([0, 2, 3, 4, 5, 6, 7, 8, 9])
    assert pool.allocate(other)
    assert other.num_computed_tokens == 0


def test_cache_salt_isolates_tenants() -> None:
    pool = BlockPool(num_blocks=16, block_size=4)
    a = make_seq(list(range(9)), salt="tenant-a")
    assert pool.allocate(a)
    run_prefill(pool, a)
    b = make_seq(list(range(9)), salt="tenant-b")
    assert pool.allocate(b)
    assert b.num_computed_tokens == 0
    a2 = make_seq(list(range(9)), salt="tenant-a")
    assert pool.allocate(a2)
    assert a2.num_computed_tokens == 8


def test_freed_cached_blocks_are_reused_until_evicted_least_recent_first() -> None:
    pool = BlockPool(num_blocks=4, block_size=4)
    old = make_seq(list(range(100, 109)))  # 3 blocks, 2 full and hashable before the last token
    assert pool.allocate(old)
    run_prefill(pool, old)
    pool.free(old)
    assert pool.num_free == 4
    again = make_seq(list(range(100, 109)))
    assert pool.allocate(again)
    assert again.num_computed_tokens == 8, "freed blocks stay findable"
    pool.free(again)
    # A request needing every block evicts them all; then the old prefix is gone.
    big = make_seq(list(range(16)))
    assert pool.allocate(big)
    pool.free(big)
    gone = make_seq(list(range(100, 109)))
    assert pool.allocate(gone)
    assert gone.num_computed_tokens == 0
    pool.check_invariants()


def test_eviction_takes_uncached_blocks_before_cached_ones() -> None:
    pool = BlockPool(num_blocks=6, block_size=4)
    seq = make_seq(list(range(10)))  # blocks: full, full, partial
    assert pool.allocate(seq)
    run_prefill(pool, seq)
    pool.free(seq)
    filler = make_seq(list(range(50, 53)))  # one block: must not evict the cached prefix
    assert pool.allocate(filler)
    again = make_seq(list(range(10)))
    assert pool.allocate(again)
    assert again.num_computed_tokens == 8


def test_grow_adds_a_block_only_at_a_block_boundary() -> None:
    pool = BlockPool(num_blocks=4, block_size=4)
    seq = make_seq([1, 2, 3, 4])
    assert pool.allocate(seq)
    assert pool.can_grow(seq, 4) and len(seq.block_table) == 1
    seq.token_ids.append(5)
    assert pool.can_grow(seq, 5)
    pool.grow(seq, 5)
    assert len(seq.block_table) == 2 and pool.num_free == 2


def test_prefix_caching_off_never_shares() -> None:
    pool = BlockPool(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = make_seq(list(range(9)))
    assert pool.allocate(a)
    run_prefill(pool, a)
    b = make_seq(list(range(9)))
    assert pool.allocate(b)
    assert b.num_computed_tokens == 0


def test_bad_pool_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        BlockPool(num_blocks=0, block_size=16)


operation = st.one_of(
    st.tuples(st.just("alloc"), st.integers(0, 3), st.integers(1, 40)),  # (op, prefix family, length)
    st.tuples(st.just("prefill"), st.integers(0, 20), st.just(0)),
    st.tuples(st.just("decode"), st.integers(0, 20), st.just(0)),
    st.tuples(st.just("free"), st.integers(0, 20), st.just(0)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(operation, min_size=1, max_size=60))
def test_random_allocate_share_free_evict_keep_invariants(ops: list[tuple[str, int, int]]) -> None:
    pool = BlockPool(num_blocks=12, block_size=4)
    live: list[Sequence] = []
    for op, a, b in ops:
        if op == "alloc":
            seq = make_seq([a * 1000 + i for i in range(b)])  # families share prefixes
            if pool.allocate(seq):
                assert seq.num_computed_tokens < seq.num_tokens
                live.append(seq)
        elif live and op == "prefill":
            run_prefill(pool, live[a % len(live)])
        elif live and op == "decode":
            seq = live[a % len(live)]
            seq.num_computed_tokens = seq.num_tokens
            seq.token_ids.append(7)
            if pool.can_grow(seq, seq.num_tokens):
                pool.grow(seq, seq.num_tokens)
                pool.cache_full_blocks(seq)
            else:
                seq.token_ids.pop()
        elif live and op == "free":
            pool.free(live.pop(a % len(live)))
        pool.check_invariants()
        held = {bid for s in live for bid in s.block_table}
        assert pool.num_free + len(held) == pool.num_blocks
        for seq in live:
            assert len(seq.block_table) * pool.block_size >= seq.num_tokens
            for bid in seq.block_table:
                assert pool.blocks[bid].ref_count >= 1
    for seq in live:
        pool.free(seq)
    assert pool.num_free == pool.num_blocks
    pool.check_invariants()


def test_a_fork_shares_full_prompt_blocks_and_the_last_user_frees_them() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    parent = make_seq(list(range(10)))
    assert pool.allocate(parent)
    run_prefill(pool, parent)
    children = [make_seq(list(range(10))) for _ in range(3)]
    for child in children:
        pool.fork(parent, child, 2)
        pool.grow(child, 10)  # its own block for the partial tail
    assert [pool.blocks[b].ref_count for b in parent.block_table] == [4, 4, 1]
    assert all(c.block_table[:2] == parent.block_table[:2] and c.num_computed_tokens == 8 for c in children)
    assert pool.num_free == 8 - 3 - 3
    for seq in [parent, *children]:
        pool.free(seq)
        pool.check_invariants()
    assert pool.num_free == 8
