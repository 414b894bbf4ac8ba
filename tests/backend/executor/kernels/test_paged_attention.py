"""Paged attention kernel against a dense fp32 oracle and the torch reference backend."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from backend.executor.attention.torch_attention import TorchAttention
from backend.executor.attention.triton_attention import TritonAttention
from backend.executor.kernels import paged_attention
from backend.executor.kernels.paged_attention import decode_splits
from tests.backend.executor.kernels.paged_batch import PagedBatch, SeqSpec, dense_attention, make_batch

TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}

# Decodes at lengths 1, 15, 16, 17 and a few hundred; whole prefills of 15, 16, 17; chunks after a cached
# prefix; and a sequence that reuses another's blocks.
MIXED = [
    SeqSpec(q_len=1, context_len=1),
    SeqSpec(q_len=1, context_len=15),
    SeqSpec(q_len=1, context_len=16),
    SeqSpec(q_len=1, context_len=17),
    SeqSpec(q_len=1, context_len=300),
    SeqSpec(q_len=15, context_len=15),
    SeqSpec(q_len=16, context_len=16),
    SeqSpec(q_len=17, context_len=17),
    SeqSpec(q_len=9, context_len=41),
    SeqSpec(q_len=3, context_len=36, shares_prefix_with=8),
]


def _run(batch: PagedBatch) -> torch.Tensor:
    m = batch.meta
    scale = batch.q.shape[-1] ** -0.5
    return paged_attention(
        batch.q, batch.k_cache, batch.v_cache, m.query_start_loc, m.context_lens, m.block_tables, m.max_query_len, scale
    )


def _assert_matches_oracle(batch: PagedBatch, out: torch.Tensor) -> None:
    expected = dense_attention(batch, batch.q.shape[-1] ** -0.5)
    torch.testing.assert_close(out.float().cpu(), expected, atol=TOLERANCE[batch.q.dtype], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize(("num_kv_heads", "group"), [(2, 1), (1, 3), (2, 4), (1, 8)])
def test_mixed_prefill_and_decode_batch_matches_dense_attention(
    dtype: torch.dtype, head_dim: int, num_kv_heads: int, group: int, device: torch.device, rng: torch.Generator
) -> None:
    batch = make_batch(
        MIXED, num_kv_heads=num_kv_heads, group=group, head_dim=head_dim, dtype=dtype, device=device, rng=rng
    )
    _assert_matches_oracle(batch, _run(batch))


def test_bf16_cache_matches_dense_attention(device: torch.device, rng: torch.Generator) -> None:
    specs = [SeqSpec(1, 17), SeqSpec(17, 17), SeqSpec(5, 40)]
    batch = make_batch(specs, num_kv_heads=2, group=3, head_dim=64, dtype=torch.bfloat16, device=device, rng=rng)
    _assert_matches_oracle(batch, _run(batch))


def test_pure_decode_batch_with_long_contexts(device: torch.device, rng: torch.Generator) -> None:
    specs = [SeqSpec(1, n) for n in (257, 1, 300, 33)]
    batch = make_batch(specs, num_kv_heads=2, group=4, head_dim=64, dtype=torch.float16, device=device, rng=rng)
    _assert_matches_oracle(batch, _run(batch))


def test_long_prefill_chunk_spans_several_query_tiles(device: torch.device, rng: torch.Generator) -> None:
    specs = [SeqSpec(q_len=150, context_len=200), SeqSpec(1, 20)]
    batch = make_batch(specs, num_kv_heads=1, group=3, head_dim=64, dtype=torch.float32, device=device, rng=rng)
    _assert_matches_oracle(batch, _run(batch))


def test_shared_prefix_blocks_serve_both_sequences(device: torch.device, rng: torch.Generator) -> None:
    specs = [SeqSpec(1, 64), SeqSpec(q_len=4, context_len=52, shares_prefix_with=0)]
    batch = make_batch(specs, num_kv_heads=2, group=1, head_dim=64, dtype=torch.float32, device=device, rng=rng)
    shared = batch.meta.block_tables[0, :3]
    assert torch.equal(batch.meta.block_tables[1, :3], shared)
    _assert_matches_oracle(batch, _run(batch))


def test_padded_rows_come_back_zero_and_leave_real_rows_intact(
    device: torch.device, rng: torch.Generator
) -> None:
    specs = [SeqSpec(1, 20), SeqSpec(3, 3)]
    batch = make_batch(
        specs, num_kv_heads=1, group=4, head_dim=64, dtype=torch.float16, device=device, rng=rng, num_padded_rows=5
    )
    out = _run(batch)
    assert torch.count_nonzero(out[-5:]) == 0
    _assert_matches_oracle(batch, out)


@pytest.mark.parametrize("block_size", [1, 8, 12])
def test_block_sizes_other_than_sixteen(block_size: int, device: torch.device, rng: torch.Generator) -> None:
    specs = [SeqSpec(1, 25), SeqSpec(6, 30), SeqSpec(2, 13, shares_prefix_with=1)]
    batch = make_batch(
        specs, num_kv_heads=2, group=2, head_dim=64, dtype=torch.float32, device=device, rng=rng, block_size=block_size
    )
    _assert_matches_oracle(batch, _run(batch))


def test_empty_batch_returns_empty_output(device: torch.device, rng: torch.Generator) -> None:
    batch = make_batch([], num_kv_heads=1, group=1, head_dim=64, dtype=torch.float32, device=device, rng=rng)
    assert _run(batch).shape == (0, 1, 64)


def test_matches_torch_reference_backend(device: torch.device, rng: torch.Generator) -> None:
    batch = make_batch(MIXED, num_kv_heads=1, group=3, head_dim=64, dtype=torch.float32, device=device, rng=rng)
    scale = 64**-0.5
    m = batch.meta
    # The torch path is the CPU reference: on a GPU run the kernel's output comes back to compare.
    cpu_meta = dataclasses.replace(
        m,
        query_start_loc=m.query_start_loc.cpu(),
        context_lens=m.context_lens.cpu(),
        block_tables=m.block_tables.cpu(),
        slot_mapping=m.slot_mapping.cpu(),
    )
    reference = TorchAttention()
    plan = reference.plan(cpu_meta, batch.k_cache.shape[1], batch.k_cache.dtype)
    expected = reference.attend(batch.q.cpu(), batch.k_cache.cpu(), batch.v_cache.cpu(), plan, scale)
    torch.testing.assert_close(_run(batch).cpu(), expected, atol=2e-5, rtol=0)


DECODES = [
    SeqSpec(1, 1),
    SeqSpec(1, 17),
    SeqSpec(1, 300),
    SeqSpec(0, 10),  # a sequence with nothing new this step
    SeqSpec(1, 64),
    SeqSpec(1, 65, shares_prefix_with=4),
]


@pytest.mark.parametrize("num_splits", [3, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_split_context_decode_matches_dense_attention(
    num_splits: int, dtype: torch.dtype, device: torch.device, rng: torch.Generator
) -> None:
    batch = make_batch(
        DECODES, num_kv_heads=2, group=4, head_dim=64, dtype=dtype, device=device, rng=rng, num_padded_rows=2
    )
    m = batch.meta
    out = paged_attention(
        batch.q, batch.k_cache, batch.v_cache, m.query_start_loc, m.context_lens, m.block_tables, 1, 64**-0.5,
        max_context_len=m.max_context_len, num_splits=num_splits,
    )
    assert torch.count_nonzero(out[-2:]) == 0
    _assert_matches_oracle(batch, out)


def test_backend_splits_a_lone_long_decode_and_still_matches(device: torch.device, rng: torch.Generator) -> None:
    batch = make_batch([SeqSpec(1, 300)], num_kv_heads=2, group=3, head_dim=128, dtype=torch.float16, device=device, rng=rng)
    assert decode_splits(1, 2, batch.meta.max_context_len) > 1
    attention = TritonAttention()
    plan = attention.plan(batch.meta, batch.k_cache.shape[1], batch.k_cache.dtype)
    out = attention.attend(batch.q, batch.k_cache, batch.v_cache, plan, 128**-0.5)
    _assert_matches_oracle(batch, out)


def test_decode_splits_only_when_few_programs_would_run() -> None:
    assert decode_splits(num_seqs=1, num_kv_heads=8, max_context_len=512) == 8  # 64 keys per split
    assert decode_splits(num_seqs=16, num_kv_heads=8, max_context_len=512) == 2
    assert decode_splits(num_seqs=128, num_kv_heads=8, max_context_len=512) == 1
    assert decode_splits(num_seqs=1, num_kv_heads=1, max_context_len=10) == 1
    assert decode_splits(num_seqs=1, num_kv_heads=1, max_context_len=100_000) == 16
