"""Speculative decoding (prompt lookup): same greedy tokens, same sampling distribution, no leaked blocks."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from backend.engine.core import Engine, EngineConfig
from backend.engine.sampling_params import SamplingParams
from backend.engine.spec import draft_model
from backend.engine.spec.speculation import propose_ngram
from backend.engine.spec.state import DraftState, worth_drafting
from backend.loading.loader import load_model
from tests.backend.tiny_models import tiny_config, tiny_hf_model, write_hf_folder

GROUNDED = ("The lighthouse keeper climbed the stairs at dusk, lit the great lamp, and wrote in his log "
            "that the sea was calm and the ships were safe.")


def test_prompt_lookup_proposes_what_followed_the_longest_recent_match() -> None:
    assert propose_ngram([1, 2, 3, 9, 9, 1, 2, 3], 2) == ([9, 9], 3)
    assert propose_ngram([5, 3, 7, 4, 3, 8, 1, 3], 3) == ([8, 1, 3], 1)  # the most recent earlier 3
    assert propose_ngram([4, 1, 2, 3, 5, 0, 4, 1, 2, 3], 1) == ([5], 4)
    assert propose_ngram([1, 2, 3, 4], 4) == ([], 0)
    assert propose_ngram([7, 7, 7], 4) == ([7], 2)  # the match may overlap the suffix, never be it


def _lookup_as_written(token_ids: list[int], k: int, max_n: int, min_n: int) -> tuple[list[int], int]:
    """The lookup's definition, literally: longest n first, then the most recent match of it."""
    length = len(token_ids)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        for end in range(length - 2, n - 2, -1):
            if token_ids[end - n + 1 : end + 1] == token_ids[length - n :]:
                return token_ids[end + 1 : end + 1 + k], n
    return [], 0


def test_prompt_lookup_agrees_with_its_definition_on_random_histories() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        ids = [rng.randrange(rng.choice([2, 3, 5, 20])) for _ in range(rng.randint(1, 60))]
        k, max_n = rng.randint(1, 7), rng.randint(1, 5)
        min_n = rng.randint(1, max_n)
        assert propose_ngram(ids, k, max_n, min_n) == _lookup_as_written(ids, k, max_n, min_n), (ids, k, max_n, min_n)


def test_drafts_are_as_long_as_their_acceptance_pays_for() -> None:
    # at one decoding sequence a row costs a quarter of a step: the j-th draft pays while p ** j > 0.25
    assert [worth_drafting(p, 16) for p in (0.0, 0.2, 0.3, 0.6, 0.9, 1.0)] == [0, 0, 1, 2, 13, 16]
    assert worth_drafting(0.9, 4) == 4
    # more decoding sequences make each row dearer against the tokens a step yields
    assert [worth_drafting(0.6, 16, n) for n in (1, 2, 3, 4)] == [2, 1, 1, 1]
    assert worth_drafting(0.5, 16, 4) == 0


def test_each_source_of_drafts_keeps_its_own_acceptance_and_recovers_after_failing() -> None:
    state = DraftState()
    assert state.draft_length(3, 6, 1) == 2  # nothing seen yet: the prior
    for _ in range(6):
        state.observe(2, 2)  # every draft from 3-token matches accepted
    assert state.draft_length(3, 6, 1) == 6
    assert state.draft_length(1, 6, 1) > 0
    for _ in range(6):
        state.observe(4, 0)  # 1-token matches keep failing
    assert state.draft_length(1, 6, 1) == 0 and state.draft_length(3, 6, 1) == 6
    steps = 0
    while state.draft_length(1, 6, 1) == 0:  # declined matches pull the estimate back toward the prior
        steps += 1
    assert 1 <= steps <= 40


def _run(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    return [c.token_ids for c in engine.generate_offline(prompts, params)]


def test_greedy_tokens_are_identical_with_prompt_lookup_and_every_block_returns(
    make_engine: Any, loaded_model: Any
) -> None:
    tok = loaded_model.tokenizer
    chat = [f"Repeat this text exactly: {GROUNDED}", f"Copy the first sentence of: {GROUNDED}"]
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": c}])) for c in chat]
    prompts.append(tok.encode("1, 2, 3, 4, 5, 6,"))
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain = _run(make_engine(speculative="none"), prompts, params)
    engine = make_engine(speculative="ngram")
    assert _run(engine, prompts, params) == plain
    stats = engine.stats()
    assert 0 < stats.spec_accepted_tokens <= stats.spec_draft_tokens
    assert stats.steps < params.max_tokens  # accepted drafts saved steps
    assert stats.kv_blocks_free == stats.kv_blocks_total
    engine.pool.check_invariants()


def test_stop_strings_and_max_tokens_cut_a_verified_run_where_plain_decoding_would(
    make_engine: Any, loaded_model: Any
) -> None:
    prompt = loaded_model.tokenizer.encode("1, 2, 3, 4, 5, 6,")
    for params in (SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True),
                   SamplingParams(max_tokens=24, temperature=0.0, stop=[" 11,"])):
        [plain] = make_engine(speculative="none").generate_offline([prompt], params)
        engine = make_engine(speculative="ngram")
        [drafted] = engine.generate_offline([prompt], params)
        assert (drafted.text, drafted.token_ids, drafted.finish_reason) == (
            plain.text, plain.token_ids, plain.finish_reason)
        assert engine.stats().spec_accepted_tokens > 0
        assert engine.stats().kv_blocks_free == engine.stats().kv_blocks_total


def test_a_draft_model_proposes_greedy_tokens_that_verify_to_the_same_output(
    make_engine: Any, loaded_model: Any, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = [loaded_model.tokenizer.encode(p) for p in ("The capital of France is", "Once upon a time,")]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    plain = _run(make_engine(speculative="none"), prompts, params)

    def load_draft(path: Path, **_: Any) -> Any:  # the file's model is loaded here already: a second load was 14 s
        assert path == model_path
        return loaded_model

    monkeypatch.setattr(draft_model, "load_model", load_draft)
    # the served model as its own draft: every draft is right, so drafts lengthen (1, 2, then K = 3 tokens at
    # two decoding sequences) and 12 tokens take a prefill and four steps
    engine = make_engine(speculative="draft", speculative_model=str(model_path), num_speculative_tokens=3)
    assert _run(engine, prompts, params) == plain
    stats = engine.stats()
    assert stats.spec_accepted_tokens == stats.spec_draft_tokens > 0 and stats.steps <= 5
    assert stats.kv_blocks_free == stats.kv_blocks_total


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny random model with a sharpened head, so that prompt-lookup drafts are accepted now and then."""
    model = tiny_hf_model(tiny_config(), seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(60)
    return load_model(write_hf_folder(model, tmp_path_factory.mktemp("tiny")))


def _histogram(loaded: Any, speculative: str, rounds: int) -> tuple[Counter[tuple[int, int]], Engine]:
    """(position, token) counts of 4-token samples, four requests per batch, from a prompt that holds the
    model's own greedy continuation of its end, so that drafts exist and are sometimes right."""
    config = EngineConfig(Path("tiny"), threads=1, kv_cache_memory=4 * 1024 * 1024, speculative=speculative)
    engine = Engine(config, loaded=loaded)
    start = list(b"abcdef")
    [greedy] = _run(engine, [start], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    prompt = start + greedy + start
    params = SamplingParams(max_tokens=4, temperature=1.0, ignore_eos=True)
    torch.manual_seed(1234)
    counts: Counter[tuple[int, int]] = Counter()
    for _ in range(rounds):
        for tokens in _run(engine, [prompt] * 4, params):
            counts.update(enumerate(tokens))
    engine.shutdown()
    return counts, engine


def test_sampled_tokens_keep_the_target_distribution_under_rejection_sampling(tiny_model: Any) -> None:
    plain, _ = _histogram(tiny_model, "none", 120)
    drafted, engine = _histogram(tiny_model, "ngram", 120)
    stats = engine.stats()
    assert 50 < stats.spec_accepted_tokens < stats.spec_draft_tokens - 50  # both paths ran, often
    # Two-sample chi-square (equal sizes) over (position, token) bins with 20 or more samples in all; the
    # rarer tokens pooled into one bin per position.
    a: Counter[tuple[int, int]] = Counter()
    b: Counter[tuple[int, int]] = Counter()
    for key in plain.keys() | drafted.keys():
        bin_key = key if plain[key] + drafted[key] >= 20 else (key[0], -1)
        a[bin_key] += plain[key]
        b[bin_key] += drafted[key]
    bins = [k for k in a.keys() | b.keys() if a[k] + b[k] > 0]
    statistic = sum((a[k] - b[k]) ** 2 / (a[k] + b[k]) for k in bins)
    df = len(bins) - 4  # one constraint per position
    z = 3.09  # p = 0.001, through Wilson-Hilferty's approximation of the chi-square quantile
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    assert df > 4 and statistic < critical
