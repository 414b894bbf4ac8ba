"""KV write kernel: every new row lands in its slot, padded rows touch nothing."""

from __future__ import annotations

import pytest
import torch

from backend.executor.attention.base import AttentionMetadata
from backend.executor.attention.torch_attention import TorchAttention
from backend.executor.kernels import write_kv


def _caches(
    num_blocks: int, block_size: int, kvh: int, head_dim: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (num_blocks, block_size, kvh, head_dim)
    return torch.full(shape, 7.0, dtype=dtype, device=device), torch.full(shape, -7.0, dtype=dtype, device=device)


def _reference_write(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
) -> None:
    """The torch backend's write, planned as one sequence holding every row: only the slots matter to it."""
    rows = slots.numel()
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, rows], dtype=torch.int32),
        context_lens=torch.tensor([rows], dtype=torch.int32),
        block_tables=torch.zeros(1, 1, dtype=torch.int32),
        slot_mapping=slots,
        max_query_len=rows,
        max_context_len=rows,
    )
    reference = TorchAttention(use_kernel=False)
    reference.write_kv(k, v, k_cache, v_cache, reference.plan(meta, k_cache.shape[1], k_cache.dtype))


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kvh", [1, 3, 8])
def test_rows_land_in_their_slots_and_padding_is_skipped(
    cache_dtype: torch.dtype, head_dim: int, kvh: int, device: torch.device, rng: torch.Generator
) -> None:
    block_size, num_blocks = 16, 9
    k_cache, v_cache = _caches(num_blocks, block_size, kvh, head_dim, cache_dtype, device)
    slots = torch.randperm(num_blocks * block_size, generator=rng)[:20]
    slots[[3, 11, 19]] = -1
    # fp32 rows cast into fp16 caches; bf16 caches get bf16 rows, because the CPU interpreter rounds
    # fp32 -> bf16 differently from torch (the GPU rounds to nearest even, like torch).
    source = torch.bfloat16 if cache_dtype == torch.bfloat16 else torch.float32
    k = torch.randn(20, kvh, head_dim, generator=rng).to(source).to(device)
    v = torch.randn(20, kvh, head_dim, generator=rng).to(source).to(device)
    write_kv(k, v, k_cache, v_cache, slots.to(device))

    flat_k, flat_v = k_cache.view(-1, kvh, head_dim).cpu(), v_cache.view(-1, kvh, head_dim).cpu()
    real = slots >= 0
    # Cast on the way in, exactly as a torch copy into the cache would round.
    assert torch.equal(flat_k[slots[real]], k.cpu()[real].to(cache_dtype))
    assert torch.equal(flat_v[slots[real]], v.cpu()[real].to(cache_dtype))
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool)
    untouched[slots[real]] = False
    assert bool((flat_k[untouched] == 7.0).all()) and bool((flat_v[untouched] == -7.0).all())


def test_matches_torch_reference_on_strided_views(device: torch.device, rng: torch.Generator) -> None:
    # k and v arrive as views into a fused qkv projection: rows are strided, heads contiguous.
    kvh, head_dim, tokens = 2, 64, 13
    qkv = torch.randn(tokens, (4 + 2 * kvh) * head_dim, generator=rng).to(torch.float16).to(device)
    k = qkv[:, 4 * head_dim : (4 + kvh) * head_dim].view(tokens, kvh, head_dim)
    v = qkv[:, (4 + kvh) * head_dim :].view(tokens, kvh, head_dim)
    slots = torch.tensor([5, 6, 7, -1, 40, 41, 0, 1, 2, 63, 62, -1, 30], dtype=torch.int64, device=device)
    ours = _caches(4, 16, kvh, head_dim, torch.float16, device)
    theirs = _caches(4, 16, kvh, head_dim, torch.float16, torch.device("cpu"))  # the reference runs on CPU
    write_kv(k, v, *ours, slots)
    _reference_write(k.cpu(), v.cpu(), *theirs, slots.cpu())
    assert torch.equal(ours[0].cpu(), theirs[0]) and torch.equal(ours[1].cpu(), theirs[1])


def test_all_padding_and_empty_steps_write_nothing(device: torch.device) -> None:
    k_cache, v_cache = _caches(2, 16, 1, 64, torch.float32, device)
    k = torch.ones(3, 1, 64, device=device)
    write_kv(k, k, k_cache, v_cache, torch.full((3,), -1, dtype=torch.int64, device=device))
    write_kv(k[:0], k[:0], k_cache, v_cache, torch.empty(0, dtype=torch.int64, device=device))
    assert bool((k_cache == 7.0).all()) and bool((v_cache == -7.0).all())
