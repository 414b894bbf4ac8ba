"""The C++ decode attention reads the paged cache in place and gives what the SDPA path gives over gathered blocks."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from backend.executor.attention.base import AttentionMetadata
from backend.executor.attention.torch_attention import TorchAttention
from backend.executor.cpu import paged_kernel
from tests.backend.torch_threads import torch_threads

pytestmark = pytest.mark.skipif(not paged_kernel.available(), reason="the C++ kernel does not build here")


def random_step(
    q_lens: list[int], context_lens: list[int], heads: int, kv_heads: int, dim: int, block: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Queries, random caches and the metadata of one step whose sequences' blocks are scattered through the pool."""
    gen = torch.Generator().manual_seed(seed)
    widths = [-(-n // block) for n in context_lens]
    num_blocks = sum(widths) + 7
    k_cache = torch.randn(num_blocks, block, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_blocks, block, kv_heads, dim, generator=gen)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [[free.pop() for _ in range(w)] + [0] * (max(widths) - w) for w in widths]
    starts = torch.tensor([0, *q_lens]).cumsum(0)
    meta = AttentionMetadata(
        query_start_loc=starts.to(torch.int32),
        context_lens=torch.tensor(context_lens, dtype=torch.int32),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        slot_mapping=torch.zeros(sum(q_lens), dtype=torch.int64),  # attend reads only its length
        max_query_len=max(q_lens),
        max_context_len=max(context_lens),
    )
    return torch.randn(sum(q_lens), heads, dim, generator=gen), k_cache, v_cache, meta


def assert_kernel_matches_sdpa(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               meta: AttentionMetadata) -> None:
    # Both read the same cache values (a 16-bit cache widened to float32), so only summation orders differ.
    scale = 1 / math.sqrt(q.shape[-1])
    kernel, sdpa = TorchAttention(), TorchAttention(use_kernel=False)
    plan = kernel.plan(meta, k_cache.shape[1], k_cache.dtype)
    assert plan.kernel is not None and not plan.decodes, "the kernel takes every decode"
    got = kernel.attend(q, k_cache, v_cache, plan, scale)
    expected = sdpa.attend(q, k_cache, v_cache, sdpa.plan(meta, k_cache.shape[1], k_cache.dtype), scale)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block"),
    [(9, 3, 64, 16), (8, 8, 8, 4), (12, 2, 128, 32), (4, 1, 24, 16), (6, 2, 20, 8)],
    ids=["smollm2", "no-groups", "wide-heads", "one-kv-head", "head-dim-not-a-multiple-of-8"],
)
def test_decodes_of_mixed_lengths_match_sdpa(heads: int, kv_heads: int, dim: int, block: int) -> None:
    lengths = [1, block - 1, block, block + 1, 37 * block + 5, 3 * block]
    q, k_cache, v_cache, meta = random_step([1] * len(lengths), lengths, heads, kv_heads, dim, block, seed=heads)
    assert_kernel_matches_sdpa(q, k_cache, v_cache, meta)


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("heads", "dim"), [(9, 64), (6, 20)], ids=["smollm2", "head-dim-not-a-multiple-of-8"])
def test_16_bit_caches_are_read_as_their_float32_values(cache_dtype: torch.dtype, heads: int, dim: int) -> None:
    lengths = [1, 15, 16, 17, 300]
    q, k_cache, v_cache, meta = random_step([1, 1, 5, 1, 1], lengths, heads, 3, dim, 16, seed=dim)
    assert_kernel_matches_sdpa(q, k_cache.to(cache_dtype), v_cache.to(cache_dtype), meta)


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("threads", [1, 2])
def test_one_long_sequence_split_over_threads_matches_sdpa(threads: int) -> None:
    # One sequence has fewer (sequence, KV head) pairs than two threads want: its blocks are split in ranges.
    with torch_threads(threads):
        q, k_cache, v_cache, meta = random_step([1], [1000], 9, 3, 64, 16, seed=threads)
        assert_kernel_matches_sdpa(q, k_cache, v_cache, meta)


@pytest.mark.usefixtures("kernel_path")
def test_verification_rows_attend_causally_over_their_drafts() -> None:
    # A decode, a sequence verifying four drafts (five rows), and a short prompt read whole: each row sees the
    # context up to its own position, as the SDPA prefill path computes it.
    q, k_cache, v_cache, meta = random_step([1, 5, 3, 16], [40, 300, 3, 70], 9, 3, 64, 16, seed=5)
    assert_kernel_matches_sdpa(q, k_cache, v_cache, meta)


def test_long_prefill_chunks_and_other_dtypes_keep_sdpa() -> None:
    meta = random_step([1, 40], [20, 40], 9, 3, 64, 16, seed=9)[3]
    attention = TorchAttention()
    plan = attention.plan(meta, 16, torch.float32)
    assert plan.kernel is not None and plan.kernel.starts.tolist() == [0] and len(plan.prefills) == 1
    assert attention.plan(meta, 16, torch.float16).kernel is not None
    assert attention.plan(meta, 16, torch.float64).kernel is None


def test_a_prefill_chunk_over_a_16_bit_cache_attends_its_widened_values() -> None:
    # SDPA's path (prefill chunks, and decodes where the kernel does not serve) widens the gathered blocks.
    q, k_cache, v_cache, meta = random_step([1, 40], [20, 70], 9, 3, 64, 16, seed=3)
    half_k, half_v = k_cache.half(), v_cache.half()
    for attention in (TorchAttention(), TorchAttention(use_kernel=False)):
        got = attention.attend(q, half_k, half_v, attention.plan(meta, 16, torch.float16), 0.125)
        expected = attention.attend(q, half_k.float(), half_v.float(), attention.plan(meta, 16, torch.float32), 0.125)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a["block_tables"].fill_(10**6), "block id out of range"),
        (lambda a: a["context_lens"].fill_(10**4), "more blocks than its table has"),
        (lambda a: a.update(q_lens=a["q_lens"] + 40), "rows must lie in q"),
        (lambda a: a.update(k_cache=a["k_cache"][..., :8].contiguous(), v_cache=a["v_cache"][..., :8].contiguous()),
         "head_dim must match"),
        (lambda a: a.update(starts=a["starts"].long()), "starts: contiguous int32"),
    ],
    ids=["block-id", "table-width", "rows", "head-dim", "index-dtype"],
)
def test_inconsistent_inputs_raise_instead_of_reading_out_of_bounds(
    change: Callable[[dict[str, torch.Tensor]], object], message: str
) -> None:
    q, k_cache, v_cache, meta = random_step([1, 1], [20, 33], 9, 3, 64, 16, seed=1)
    args = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "out": torch.empty_like(q),
            "starts": torch.tensor([0, 1], dtype=torch.int32), "q_lens": torch.tensor([1, 1], dtype=torch.int32),
            "context_lens": meta.context_lens.clone(), "block_tables": meta.block_tables.clone()}
    change(args)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.tidegate.paged_attention(*args.values(), 0.125)


def test_write_kv_puts_each_row_at_its_slot_and_skips_padded_rows() -> None:
    # k and v as the model hands them over: strided views of one step's fused rows.
    kv = torch.randn(5, 2, 3, 8, generator=torch.Generator().manual_seed(0))
    k, v = kv[:, 0], kv[:, 1]
    slots = torch.tensor([7, -1, 0, 23, 12])
    k_cache, v_cache = torch.zeros(2, 6, 4, 3, 8)
    paged_kernel.write_kv(k, v, k_cache, v_cache, slots)
    written = slots >= 0
    expected_k, expected_v = torch.zeros(2, 24, 3, 8)
    expected_k.index_copy_(0, slots[written], k[written])
    expected_v.index_copy_(0, slots[written], v[written])
    assert torch.equal(k_cache.view(24, 3, 8), expected_k) and torch.equal(v_cache.view(24, 3, 8), expected_v)
    for bad, message in ((torch.tensor([0, 0, 0, 0, 24]), "slot 24 outside"), (slots.int(), "int64")):
        with pytest.raises(RuntimeError, match=message):
            paged_kernel.write_kv(k, v, k_cache, v_cache, bad)


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.bfloat16])
def test_write_kv_rounds_to_a_16_bit_cache_as_torch_does(cache_dtype: torch.dtype) -> None:
    # 20 values a head: two vectors of eight and a tail, with values past float16's range and its subnormals.
    kv = torch.randn(6, 2, 2, 20, generator=torch.Generator().manual_seed(1)) * torch.tensor([1e-6, 1.0, 1e5])[
        torch.arange(20) % 3]
    k, v = kv[:, 0], kv[:, 1]
    slots = torch.tensor([3, -1, 0, 9, 14, 5])
    k_cache, v_cache = torch.zeros(2, 2, 8, 2, 20, dtype=cache_dtype)
    paged_kernel.write_kv(k, v, k_cache, v_cache, slots)
    written = slots >= 0
    expected_k, expected_v = torch.zeros(2, 16, 2, 20, dtype=cache_dtype)
    expected_k.index_copy_(0, slots[written], k[written].to(cache_dtype))
    expected_v.index_copy_(0, slots[written], v[written].to(cache_dtype))
    assert torch.equal(k_cache.view(16, 2, 20), expected_k) and torch.equal(v_cache.view(16, 2, 20), expected_v)


def test_caches_of_other_or_mixed_dtypes_are_refused() -> None:
    q, k_cache, v_cache, meta = random_step([1], [20], 9, 3, 64, 16, seed=1)
    index = torch.tensor([0], dtype=torch.int32)
    for keys, values in ((k_cache.double(), v_cache.double()), (k_cache.half(), v_cache)):
        with pytest.raises(RuntimeError, match="float32, float16 or bfloat16"):
            torch.ops.tidegate.paged_attention(q, keys, values, torch.empty_like(q), index, index + 1,
                                               meta.context_lens, meta.block_tables, 0.125)
