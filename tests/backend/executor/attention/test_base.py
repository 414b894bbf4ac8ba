"""Paged TorchAttention equals dense causal attention, whatever the block layout and batch mix, from one plan per step,
through the C++ decode kernel and through SDPA alike."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from backend.executor.attention.base import AttentionMetadata
from backend.executor.attention.torch_attention import TorchAttention
from tests.backend.torch_threads import torch_threads

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 6, 2, 16, 4

pytestmark = pytest.mark.usefixtures("attention_path")


@dataclass
class Seq:
    context_len: int  # after this step
    q_len: int  # new tokens this step
    shared_from: int | None = None  # index of a sequence whose first block(s) this one shares
    shared_blocks: int = 0


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [n, h, d] for the last n positions of k/v [L, kvh, d]; plain softmax with a causal mask."""
    n, length = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    pos = torch.arange(length - n, length)
    scores = scores.masked_fill(torch.arange(length)[None, :] > pos[:, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def run_case(
    seqs: list[Seq], num_blocks: int = 64, seed: int = 0, pad_rows: int = 0, attention: TorchAttention | None = None,
    consecutive: bool = False,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    k_cache = torch.zeros(num_blocks, BLOCK, KV_HEADS, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)
    # scattered, or in order as a fresh pool hands them out; block 0 never used
    free = list(range(num_blocks - 1, 0, -1)) if consecutive else torch.randperm(num_blocks - 1, generator=gen).add(1).tolist()
    tables: list[list[int]] = []
    keys, values, queries, slots = [], [], [], []
    for seq in seqs:
        k = torch.randn(seq.context_len, KV_HEADS, HEAD_DIM, generator=gen)
        v = torch.randn(seq.context_len, KV_HEADS, HEAD_DIM, generator=gen)
        table = [free.pop() for _ in range(-(-seq.context_len // BLOCK))]
        if seq.shared_from is not None:
            # The shared prefix blocks hold the other sequence's tokens: same keys, same block ids.
            shared = seq.shared_blocks * BLOCK
            k[:shared], v[:shared] = keys[seq.shared_from][:shared], values[seq.shared_from][:shared]
            table[: seq.shared_blocks] = tables[seq.shared_from][: seq.shared_blocks]
        tables.append(table)
        keys.append(k)
        values.append(v)
        cached = seq.context_len - seq.q_len
        for p in range(cached):  # the cached prefix is already in the cache before the step
            k_cache[table[p // BLOCK], p % BLOCK] = k[p]
            v_cache[table[p // BLOCK], p % BLOCK] = v[p]
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(cached, seq.context_len)]
        queries.append(torch.randn(seq.q_len, HEADS, HEAD_DIM, generator=gen))
    width = max(len(t) for t in tables)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, *torch.tensor([s.q_len for s in seqs]).cumsum(0).tolist()], dtype=torch.int32),
        context_lens=torch.tensor([s.context_len for s in seqs], dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        slot_mapping=torch.tensor(slots + [-1] * pad_rows, dtype=torch.int64),
        max_query_len=max(s.q_len for s in seqs),
        max_context_len=max(s.context_len for s in seqs),
    )
    new_k = torch.cat([k[s.context_len - s.q_len :] for k, s in zip(keys, seqs, strict=True)])
    new_v = torch.cat([v[s.context_len - s.q_len :] for v, s in zip(values, seqs, strict=True)])
    pad = torch.zeros(pad_rows, KV_HEADS, HEAD_DIM)
    q = torch.cat([*queries, torch.zeros(pad_rows, HEADS, HEAD_DIM)])
    attention = attention or TorchAttention()
    plan = attention.plan(meta, BLOCK, k_cache.dtype)
    attention.write_kv(torch.cat([new_k, pad]), torch.cat([new_v, pad]), k_cache, v_cache, plan)
    scale = 1 / math.sqrt(HEAD_DIM)
    out = attention.attend(q, k_cache, v_cache, plan, scale)
    expected = torch.cat(
        [dense_attention(qs, k, v, scale) for qs, k, v in zip(queries, keys, values, strict=True)]
    )
    total = expected.shape[0]
    torch.testing.assert_close(out[:total], expected, rtol=1e-5, atol=1e-5)
    assert out[total:].abs().sum() == 0  # padded rows produce nothing


def test_single_prefill_from_empty_cache() -> None:
    run_case([Seq(context_len=13, q_len=13)])


def test_decode_batch_of_different_lengths() -> None:
    run_case([Seq(context_len=n, q_len=1) for n in (1, 4, 5, 17, 30, 2)])


@pytest.mark.parametrize("consecutive", [False, True])
@pytest.mark.parametrize("context_len", [1, 16, 17, 70])
def test_a_decode_alone_reads_its_blocks_in_place_or_gathered(context_len: int, consecutive: bool) -> None:
    run_case([Seq(context_len=context_len, q_len=1)], seed=context_len, consecutive=consecutive)


def test_decodes_of_one_length_and_a_decode_longer_than_a_chunk() -> None:
    run_case([Seq(context_len=21, q_len=1) for _ in range(4)], seed=13)
    run_case([Seq(context_len=40, q_len=1)], seed=14, attention=TorchAttention(decode_chunk_tokens=8), consecutive=True)


def test_prefill_chunk_over_cached_prefix() -> None:
    run_case([Seq(context_len=23, q_len=6), Seq(context_len=9, q_len=9)])


def test_mixed_decodes_and_prefill_chunks_in_one_step() -> None:
    run_case(
        [
            Seq(context_len=11, q_len=1),
            Seq(context_len=20, q_len=7),
            Seq(context_len=3, q_len=1),
            Seq(context_len=8, q_len=8),
            Seq(context_len=33, q_len=1),
        ],
        seed=3,
    )


def test_sequences_sharing_prefix_blocks() -> None:
    run_case(
        [
            Seq(context_len=12, q_len=1),
            Seq(context_len=15, q_len=3, shared_from=0, shared_blocks=2),
            Seq(context_len=9, q_len=1, shared_from=0, shared_blocks=2),
        ],
        seed=5,
    )


def test_padded_rows_are_skipped_by_write_and_zero_in_output() -> None:
    run_case([Seq(context_len=6, q_len=2), Seq(context_len=5, q_len=1)], pad_rows=3)


def test_sequence_with_no_new_tokens_is_ignored() -> None:
    run_case([Seq(context_len=7, q_len=1), Seq(context_len=4, q_len=0), Seq(context_len=6, q_len=6)])


@pytest.mark.parametrize("seed", range(6))
def test_random_batches_match_dense_attention(seed: int) -> None:
    gen = torch.Generator().manual_seed(100 + seed)
    seqs = []
    for _ in range(int(torch.randint(1, 7, (1,), generator=gen))):
        ctx = int(torch.randint(1, 40, (1,), generator=gen))
        q_len = 1 if torch.rand(1, generator=gen) < 0.5 else int(torch.randint(1, ctx + 1, (1,), generator=gen))
        seqs.append(Seq(context_len=ctx, q_len=q_len))
    run_case(seqs, num_blocks=128, seed=seed)


def test_one_attention_serves_successive_steps_each_with_its_own_plan() -> None:
    attention = TorchAttention()
    run_case([Seq(context_len=5, q_len=1)], seed=7, attention=attention)
    run_case([Seq(context_len=9, q_len=2), Seq(context_len=5, q_len=1)], seed=8, attention=attention)
    run_case([Seq(context_len=30, q_len=1), Seq(context_len=2, q_len=1)], seed=9, attention=attention)


def test_a_plan_is_fixed_when_built_and_a_new_step_gets_a_new_one() -> None:
    attention = TorchAttention()
    k_cache = torch.randn(8, BLOCK, KV_HEADS, HEAD_DIM)
    v_cache = torch.randn(8, BLOCK, KV_HEADS, HEAD_DIM)
    q = torch.randn(1, HEADS, HEAD_DIM)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        context_lens=torch.tensor([3], dtype=torch.int32),
        block_tables=torch.tensor([[2, 5]], dtype=torch.int32),
        slot_mapping=torch.tensor([2 * BLOCK + 2]),
        max_query_len=1,
        max_context_len=3,
    )
    scale = 1 / math.sqrt(HEAD_DIM)
    short_plan = attention.plan(meta, BLOCK, k_cache.dtype)
    # The next step refills the same metadata object: its plan sees six tokens, the first plan still three.
    meta.context_lens = torch.tensor([6], dtype=torch.int32)
    meta.max_context_len = 6
    longer = attention.attend(q, k_cache, v_cache, attention.plan(meta, BLOCK, k_cache.dtype), scale)
    short = attention.attend(q, k_cache, v_cache, short_plan, scale)
    keys = torch.cat([k_cache[2], k_cache[5]])
    values = torch.cat([v_cache[2], v_cache[5]])
    torch.testing.assert_close(longer, dense_attention(q, keys[:6], values[:6], scale))
    torch.testing.assert_close(short, dense_attention(q, keys[:3], values[:3], scale))


@pytest.mark.parametrize("chunk_tokens", [1, 8, 24, 4096])
def test_decodes_cut_into_length_sorted_chunks(chunk_tokens: int) -> None:
    # Chunks of one sequence, of a few, and of all: each decode sees exactly its own context.
    attention = TorchAttention(decode_chunk_tokens=chunk_tokens)
    decodes = [Seq(context_len=n, q_len=1) for n in (30, 1, 17, 4, 16, 5, 33, 16)]
    run_case([*decodes, Seq(context_len=20, q_len=7)], num_blocks=128, seed=11, pad_rows=2, attention=attention)
    # The reused gather buffers are larger than the next, smaller step needs.
    run_case([Seq(context_len=3, q_len=1), Seq(context_len=2, q_len=1)], seed=12, attention=attention)


def test_decodes_and_prefill_in_bfloat16_match_float32_attention() -> None:
    gen = torch.Generator().manual_seed(21)
    k_cache = torch.randn(16, BLOCK, KV_HEADS, HEAD_DIM, generator=gen)
    v_cache = torch.randn(16, BLOCK, KV_HEADS, HEAD_DIM, generator=gen)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, 1, 2, 5], dtype=torch.int32),
        context_lens=torch.tensor([7, 13, 9], dtype=torch.int32),
        block_tables=torch.tensor([[3, 1, 0, 0], [2, 5, 7, 9], [4, 8, 6, 0]], dtype=torch.int32),
        slot_mapping=torch.arange(5),  # attend reads only its length: nothing is written here
        max_query_len=3,
        max_context_len=13,
    )
    q = torch.randn(5, HEADS, HEAD_DIM, generator=gen)
    scale = 1 / math.sqrt(HEAD_DIM)
    attention = TorchAttention()
    expected = attention.attend(q, k_cache, v_cache, attention.plan(meta, BLOCK, torch.float32), scale)
    bf16_plan = attention.plan(meta, BLOCK, torch.bfloat16)
    got = attention.attend(q.bfloat16(), k_cache.bfloat16(), v_cache.bfloat16(), bf16_plan, scale)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=0.05, atol=0.05)


def test_a_small_decode_runs_on_one_thread_and_gives_the_threads_back() -> None:
    with torch_threads(2):
        # every decode chunk of these steps is under one_thread_keys, then over it
        for keys in (1024, 0):
            run_case([Seq(context_len=n, q_len=1) for n in (9, 30, 17)], seed=keys, attention=TorchAttention(one_thread_keys=keys))
            assert torch.get_num_threads() == 2
