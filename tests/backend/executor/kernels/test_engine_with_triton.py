"""The engine's scheduler, block pool and runner run unchanged when TritonAttention replaces the torch path.

The CPU interpreter needs tens of milliseconds per kernel launch, so the workload is three engine steps (a
prefill; a prefill after a cached prefix batched with a fresh one; a decode of both) through the real
SmolLM2 cut to its first layers. Both paths run the same cut model, so their tokens must agree exactly.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path

import pytest
from torch import nn

from backend import Completion, Engine, EngineConfig, SamplingParams
from backend.executor.attention import TorchAttention
from backend.executor.kernels import TritonAttention
from backend.loading.loader import LoadedModel, attention_for
from tests.backend import engine_fixtures

loaded_model = engine_fixtures.loaded_model
# On a GPU (bench/gpu_check.sh) the engine is exercised by the throughput phase instead.
pytestmark = pytest.mark.skipif(
    os.environ.get("TIDEGATE_KERNEL_DEVICE", "cpu") != "cpu", reason="runs the CPU engine under the interpreter"
)

LAYERS = 3
# Longer than one 16-token block, so later prompts reuse the first one's cached block.
SHARED = "You are a terse assistant. Reply in a word or two, never more than that."


@pytest.fixture
def shallow_model(loaded_model: LoadedModel) -> LoadedModel:
    """The shared SmolLM2 with only its first LAYERS layers; weights are shared, the original is untouched."""
    config = dataclasses.replace(loaded_model.config, num_layers=LAYERS)
    model = copy.copy(loaded_model.model)
    model._modules = dict(model._modules)  # its own module table, so the shared model keeps every layer
    model.layers = nn.ModuleList(list(loaded_model.model.layers)[:LAYERS])
    model.config = config
    return LoadedModel(config=config, model=model, tokenizer=loaded_model.tokenizer)


def _run(engine: Engine, first: list[int], later: list[list[int]]) -> list[Completion]:
    once = engine.generate_offline([first], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    return once + engine.generate_offline(later, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))


def test_greedy_tokens_prefix_hits_and_freed_blocks_match_torch_path(
    shallow_model: LoadedModel, model_path: Path
) -> None:
    tok = shallow_model.tokenizer
    first = tok.encode(SHARED + " Sky colour?")
    later = [tok.encode(SHARED + " Grass colour?"), tok.encode("Snow colour?")]
    config = EngineConfig(model_path, kv_cache_memory=2 * 1024 * 1024)

    reference_engine = Engine(config, loaded=shallow_model)
    reference = _run(reference_engine, first, later)
    shallow_model.model.attention = TritonAttention()
    triton_engine = Engine(config, loaded=shallow_model)
    ours = _run(triton_engine, first, later)

    assert [c.token_ids for c in ours] == [c.token_ids for c in reference]
    assert [c.cached_tokens for c in ours] == [c.cached_tokens for c in reference]
    assert ours[1].cached_tokens >= 16 and ours[2].cached_tokens == 0
    for engine in (reference_engine, triton_engine):
        stats = engine.stats()
        assert stats.kv_blocks_free == stats.kv_blocks_total and stats.num_running == 0


def test_attention_for_picks_triton_only_on_cuda() -> None:
    assert isinstance(attention_for("cuda"), TritonAttention)
    assert isinstance(attention_for("cuda:1"), TritonAttention)
    assert isinstance(attention_for("cpu"), TorchAttention)
