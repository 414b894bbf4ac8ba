"""Running the model by hand over a paged cache: one sequence, scattered blocks (shared by model tests)."""

from __future__ import annotations

import torch

from backend.executor.attention.base import AttentionMetadata
from backend.executor.model.model import LlamaModel

BLOCK_SIZE = 16


def make_kv_caches(model: LlamaModel, num_blocks: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    cfg = model.config
    shape = (num_blocks, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim)
    dev = model.norm.weight.device
    return [
        (torch.zeros(shape, dtype=model.dtype, device=dev), torch.zeros(shape, dtype=model.dtype, device=dev))
        for _ in range(cfg.num_layers)
    ]


def plan_for(model: LlamaModel, meta: AttentionMetadata) -> object:
    """The step's attention plan, as the runner builds it."""
    return model.ops.attention.plan(meta, BLOCK_SIZE, model.dtype)


def single_sequence_meta(
    blocks: list[int], start: int, count: int, device: torch.device | str = "cpu"
) -> AttentionMetadata:
    """Metadata for `count` new tokens at positions start.. of one sequence stored in `blocks`."""
    ctx = start + count
    slots = [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(start, ctx)]
    return AttentionMetadata(
        query_start_loc=torch.tensor([0, count], dtype=torch.int32, device=device),
        context_lens=torch.tensor([ctx], dtype=torch.int32, device=device),
        block_tables=torch.tensor([blocks], dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=count,
        max_context_len=ctx,
    )


def paged_greedy(model: LlamaModel, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy decoding of one sequence whose cache lives in scattered, out-of-order blocks."""
    needed = -(-(len(prompt) + new_tokens) // BLOCK_SIZE)
    num_blocks = 3 * needed + 2
    blocks = list(range(num_blocks - 1, 0, -3))[:needed]  # descending and gapped, never block 0
    caches = make_kv_caches(model, num_blocks)
    out: list[int] = []
    pos, chunk = 0, prompt
    for _ in range(new_tokens):
        dev = model.norm.weight.device
        plan = plan_for(model, single_sequence_meta(blocks, pos, len(chunk), dev))
        hidden = model(torch.tensor(chunk, device=dev), torch.arange(pos, pos + len(chunk), device=dev), caches, plan)
        token = int(model.compute_logits(hidden[-1:]).argmax(-1))
        out.append(token)
        pos, chunk = pos + len(chunk), [token]
    return out


def prefill_logits(model: LlamaModel, prompt: list[int]) -> torch.Tensor:
    """Logits `[len(prompt), vocab]` of one prompt run in a single prefill."""
    blocks = list(range(1, 1 + -(-len(prompt) // BLOCK_SIZE)))
    caches = make_kv_caches(model, len(blocks) + 1)
    dev = model.norm.weight.device
    plan = plan_for(model, single_sequence_meta(blocks, 0, len(prompt), dev))
    hidden = model(torch.tensor(prompt, device=dev), torch.arange(len(prompt), device=dev), caches, plan)
    return model.compute_logits(hidden)
