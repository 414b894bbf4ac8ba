"""Shared pieces of the engine tests: engines of any size over the session's loaded model (tests/conftest.py),
and the transformers reference (greedy tokens for the same GGUF weights)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from backend.engine.core import Engine, EngineConfig
from backend.loading.loader import LoadedModel

REFERENCE_TOKENS = 48
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 4, 5,",
    "Translate to French: Good morning, how are you today?",
    "The three primary colors are",
    "Water boils at a temperature of",
    "Here is a haiku about autumn leaves:\n",
]


@pytest.fixture(scope="session")
def prompt_ids(loaded_model: LoadedModel) -> list[list[int]]:
    """The 8 prompts raw, then the same 8 through the chat template (16 token lists)."""
    tok = loaded_model.tokenizer
    raw = [tok.encode(p) for p in PROMPTS]
    chat = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS]
    return raw + chat


def hf_greedy_batch(hf_model: Any, prompts: list[list[int]], new_tokens: int, **generate: Any) -> list[list[int]]:
    """transformers' greedy continuation of each prompt (float32, at most `new_tokens`; a row that ends early is
    padded with 0), computed in one left-padded static batch: batch 1 per prompt would take minutes here."""
    width = max(len(ids) for ids in prompts)
    input_ids = torch.tensor([[0] * (width - len(ids)) + ids for ids in prompts])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts])
    with torch.inference_mode():
        generated = hf_model.generate(input_ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                      pad_token_id=0, **generate)
    return list(generated[:, width:].tolist())


@pytest.fixture(scope="session")
def reference_tokens(hf_model: Any, prompt_ids: list[list[int]]) -> list[list[int]]:
    """transformers' greedy continuation of each prompt, exactly REFERENCE_TOKENS long."""
    return hf_greedy_batch(hf_model, prompt_ids, REFERENCE_TOKENS, min_new_tokens=REFERENCE_TOKENS)


@pytest.fixture
def make_engine(loaded_model: LoadedModel, model_path: Path) -> Iterator[Any]:
    """Build engines over the shared model; each is shut down after the test."""
    engines: list[Engine] = []

    def build(**overrides: Any) -> Engine:
        config = EngineConfig(model_path=model_path, threads=1, kv_cache_memory=16 * 1024 * 1024)
        for key, value in overrides.items():
            setattr(config, key, value)
        engine = Engine(config, loaded=loaded_model)
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.shutdown()
