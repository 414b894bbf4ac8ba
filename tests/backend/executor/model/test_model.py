"""The torch Llama model over a paged cache reproduces transformers' greedy tokens for the same GGUF."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from backend.loading.loader import LoadedModel
from tests.backend.engine_fixtures import hf_greedy_batch
from tests.backend.model_harness import (
    BLOCK_SIZE,
    make_kv_caches,
    paged_greedy,
    plan_for,
    single_sequence_meta,
)

NEW_TOKENS = 48
PROMPTS = [
    "The capital of France is",
    "def quicksort(arr):",
    "Once upon a time, in a small village by the sea,",
    "1, 1, 2, 3, 5, 8,",
    "Translate to German: The weather is lovely today.",
    "Les trois couleurs primaires sont",
    "List three uses of a paperclip:\n1.",
    "今天天气很好，我们去",
]
# The engine tests compare all eight prompts both ways through the scheduler; here, model alone, a spread of
# three (code, translation, CJK) localises a parity break to the model without paying for all eight twice.
MODEL_LEVEL = PROMPTS[1::3]
References = dict[tuple[str, bool], list[int]]  # by (prompt, through the chat template)


@pytest.fixture
def smollm(loaded_model: LoadedModel) -> LoadedModel:
    return loaded_model


def encoded(smollm: LoadedModel, text: str, chat: bool) -> list[int]:
    tok = smollm.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]) if chat else text)


@pytest.fixture(scope="module")
def hf_references(loaded_model: LoadedModel, hf_model: Any) -> References:
    """transformers' greedy tokens for each prompt, raw and through the chat template, up to its first EOS:
    one batch for all six, as the engine tests' reference is, where six runs of batch 1 took 30 s."""
    prompts = {(text, chat): encoded(loaded_model, text, chat)
               for text in MODEL_LEVEL for chat in (False, True)}
    generated = hf_greedy_batch(hf_model, list(prompts.values()), NEW_TOKENS)
    eos = loaded_model.tokenizer.eos_token_ids
    references: References = {}
    for key, row in zip(prompts, generated, strict=True):
        # a row that ended is padded to the batch's end: its reference stops at its EOS
        references[key] = row[: next((i + 1 for i, token in enumerate(row) if token in eos), len(row))]
    return references


def assert_same_greedy(smollm: LoadedModel, hf_references: References, text: str, chat: bool) -> None:
    ours = paged_greedy(smollm.model, encoded(smollm, text, chat), NEW_TOKENS)
    ref = hf_references[text, chat]
    # transformers stops at EOS; up to there every token must agree.
    assert ours[: len(ref)] == ref
    assert len(ref) == NEW_TOKENS or ref[-1] in smollm.tokenizer.eos_token_ids


@pytest.mark.parametrize("text", MODEL_LEVEL)
def test_greedy_matches_transformers_on_raw_prompt(smollm: LoadedModel, hf_references: References,
                                                   text: str) -> None:
    assert_same_greedy(smollm, hf_references, text, chat=False)


@pytest.mark.parametrize("text", MODEL_LEVEL)
def test_greedy_matches_transformers_through_chat_template(smollm: LoadedModel, hf_references: References,
                                                           text: str) -> None:
    assert_same_greedy(smollm, hf_references, text, chat=True)


def test_chunked_prefill_gives_the_same_logits_as_one_pass(smollm: LoadedModel) -> None:
    model = smollm.model
    prompt = smollm.tokenizer.encode("A long prompt, fed in uneven chunks, must see its whole cached prefix. " * 3)
    blocks = list(range(1, 1 + -(-len(prompt) // BLOCK_SIZE)))
    whole_caches = make_kv_caches(model, len(blocks) + 1)
    whole_plan = plan_for(model, single_sequence_meta(blocks, 0, len(prompt)))
    whole = model(torch.tensor(prompt), torch.arange(len(prompt)), whole_caches, whole_plan)
    chunk_caches = make_kv_caches(model, len(blocks) + 1)
    pieces, pos = [], 0
    for size in (7, 16, 1, 23, len(prompt)):
        size = min(size, len(prompt) - pos)
        if size == 0:
            break
        plan = plan_for(model, single_sequence_meta(blocks, pos, size))
        pieces.append(model(torch.tensor(prompt[pos : pos + size]), torch.arange(pos, pos + size), chunk_caches, plan))
        pos += size
    torch.testing.assert_close(torch.cat(pieces), whole, rtol=1e-4, atol=1e-4)


def test_compute_logits_is_float32_over_the_vocabulary(smollm: LoadedModel) -> None:
    hidden = torch.randn(3, smollm.config.hidden_size)
    logits = smollm.model.compute_logits(hidden)
    assert logits.dtype == torch.float32
    assert logits.shape == (3, smollm.config.vocab_size)


def test_padded_rows_do_not_touch_the_cache(smollm: LoadedModel) -> None:
    model = smollm.model
    caches = make_kv_caches(model, 4)
    meta = single_sequence_meta([2], 0, 3)
    meta.slot_mapping = torch.tensor([2 * BLOCK_SIZE, 2 * BLOCK_SIZE + 1, 2 * BLOCK_SIZE + 2, -1])
    model(torch.tensor([10, 11, 12, 0]), torch.tensor([0, 1, 2, 0]), caches, plan_for(model, meta))
    k_cache, _ = caches[0]
    assert k_cache[2, :3].abs().sum() > 0
    assert k_cache[2, 3:].abs().sum() == 0
    assert k_cache[[0, 1, 3]].abs().sum() == 0
