"""Prompts of an exact token length, and loading tokenizers from the paths users pass."""

from __future__ import annotations

from pathlib import Path
from random import Random

import pytest

from bench.tokenizer import PromptTokenizer, TokenizerError, load_tokenizer


@pytest.mark.parametrize("n", [1, 2, 3, 16, 255, 256, 1000, 2048])
def test_random_text_has_exactly_the_requested_tokens(tokenizer: PromptTokenizer, n: int) -> None:
    rng = Random(n)
    for _ in range(5):
        assert tokenizer.count(tokenizer.random_text(n, rng)) == n


def test_random_text_is_seeded_and_distinct_between_draws(tokenizer: PromptTokenizer) -> None:
    first, second = tokenizer.random_text(64, Random(1)), tokenizer.random_text(64, Random(1))
    assert first == second
    rng = Random(2)
    assert tokenizer.random_text(64, rng) != tokenizer.random_text(64, rng)


def test_zero_tokens_is_the_empty_string(tokenizer: PromptTokenizer) -> None:
    assert tokenizer.random_text(0, Random(0)) == ""


def test_a_saved_tokenizer_json_loads_and_counts_like_the_gguf(tokenizer: PromptTokenizer,
                                                                 model_path: Path, tmp_path: Path) -> None:
    from bench.tokenizer import _gguf_tokenizer

    json_path = tmp_path / "tokenizer.json"
    _gguf_tokenizer(model_path).save(str(json_path))
    for source in (json_path, tmp_path):  # the file, or a folder holding it
        loaded = load_tokenizer(source)
        text = tokenizer.random_text(100, Random(5))
        assert loaded.count(text) == tokenizer.count(text) == 100


@pytest.mark.parametrize("name", ["missing.json", "missing.gguf", "weights.bin"])
def test_unusable_tokenizer_paths_fail_with_a_reason(tmp_path: Path, name: str) -> None:
    if name == "weights.bin":
        (tmp_path / name).write_bytes(b"\0" * 8)
    with pytest.raises(TokenizerError):
        load_tokenizer(tmp_path / name)
