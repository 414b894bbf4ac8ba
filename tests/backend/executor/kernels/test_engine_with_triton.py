"""The engine's scheduler, block pool and runner run unchanged when TritonAttention replaces the torch path.

The CPU interpreter needs tens of milliseconds per kernel launch, so the workload is three engine steps (a
prefill; a prefill after a cached prefix batched with a fresh one; a decode of both) through the real
SmolLM2 cut to its first layers. Both paths run the same cut model and differ only in their attention, so
their tokens must agree exactly.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from backend import Completion, Engine, EngineConfig, SamplingParams
from backend.executor.attention.torch_attention import TorchAttention
from backend.executor.attention.triton_attention import TritonAttention
from backend.executor.model.ops import ModelOps, ops_for, triton_ops
from backend.loading.loader import LoadedModel, load_model

# On a GPU (benchmarks/gpu/check.sh) the engine is exercised by the throughput phase instead.
pytestmark = pytest.mark.skipif(
    os.environ.get("TIDEGATE_KERNEL_DEVICE", "cpu") != "cpu", reason="runs the CPU engine under the interpreter"
)

LAYERS = 3
# Longer than one 16-token block, so later prompts reuse the first one's cached block.
SHARED = "You are a terse assistant. Reply in a word or two, never more than that."


def _shallow(model_path: Path, ops: ModelOps) -> LoadedModel:
    """SmolLM2 with only its first LAYERS layers, running `ops`."""
    loaded = load_model(model_path, ops=ops)
    config = dataclasses.replace(loaded.config, num_layers=LAYERS)
    loaded.model.layers = nn.ModuleList(list(loaded.model.layers)[:LAYERS])
    loaded.model.config = config
    return LoadedModel(config=config, model=loaded.model, tokenizer=loaded.tokenizer)


def _run(engine: Engine, first: list[int], later: list[list[int]]) -> list[Completion]:
    once = engine.generate_offline([first], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    return once + engine.generate_offline(later, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))


def test_greedy_tokens_prefix_hits_and_freed_blocks_match_torch_path(model_path: Path) -> None:
    torch.set_num_threads(1)  # under a shared CPU, 2-thread OMP barriers cost more than they win
    reference_model = _shallow(model_path, ops_for("cpu", torch.float32))
    # Only the attention differs: the same matrix products and torch elementwise ops around it.
    triton_model = _shallow(model_path, dataclasses.replace(ops_for("cpu", torch.float32), attention=TritonAttention()))
    tok = reference_model.tokenizer
    first = tok.encode(SHARED + " Sky colour?")
    later = [tok.encode(SHARED + " Grass colour?"), tok.encode("Snow colour?")]
    config = EngineConfig(model_path, kv_cache_memory=2 * 1024 * 1024)

    reference_engine = Engine(config, loaded=reference_model)
    reference = _run(reference_engine, first, later)
    triton_engine = Engine(config, loaded=triton_model)
    ours = _run(triton_engine, first, later)

    assert [c.token_ids for c in ours] == [c.token_ids for c in reference]
    assert [c.cached_tokens for c in ours] == [c.cached_tokens for c in reference]
    assert ours[1].cached_tokens >= 16 and ours[2].cached_tokens == 0
    for engine in (reference_engine, triton_engine):
        stats = engine.stats()
        assert stats.kv_blocks_free == stats.kv_blocks_total and stats.num_running == 0


def test_ops_for_picks_triton_only_on_cuda() -> None:
    for device in ("cuda", "cuda:1"):
        ops = ops_for(device, torch.bfloat16)
        assert isinstance(ops.attention, TritonAttention) and ops.rotary is triton_ops().rotary
    assert isinstance(ops_for("cpu", torch.bfloat16).attention, TorchAttention)
