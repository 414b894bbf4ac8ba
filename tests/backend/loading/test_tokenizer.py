"""Token ids equal transformers' for the same GGUF; streaming detokenisation never splits a character."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, pre_tokenizers
from tokenizers.models import BPE

from backend.loading.tokenizer import IncrementalDetokenizer, Tokenizer

TEXTS = [
    "Hello world",
    " leading space and  double  spaces\tand a tab",
    "Line one\nLine two\r\n\nTrailing newline\n",
    "The year 2026 has 365 days; π ≈ 3.14159, e ≈ 2.71828.",
    "naïve café résumé Ångström façade",
    "emoji: 👋🏽 🇫🇷 👨‍👩‍👧‍👦 🚀✨",
    "中文分词测试：今天天气很好。日本語のテキスト、한국어 텍스트",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "special inside<|endoftext|>text and <repo_name> tokens",
    "don't can't I'm we'll they've she'd IT'S",
    "    ",
    "",
    "http://example.com/path?q=1&r=two#frag",
    "Ѕрѕ Привет мир العربية עברית",
]


@pytest.fixture(scope="module")
def ours(gguf_metadata: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(gguf_metadata, max_context=8192)


@pytest.fixture(scope="module")
def reference(hf_tokenizer: Any) -> Any:
    return hf_tokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_transformers(ours: Tokenizer, reference: Any, text: str) -> None:
    assert ours.encode(text) == reference(text)["input_ids"]
    assert ours.encode(text, add_special_tokens=False) == reference(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("text", TEXTS)
def test_decode_equals_transformers(ours: Tokenizer, reference: Any, text: str) -> None:
    ids = ours.encode(text)
    assert ours.decode(ids, skip_special_tokens=False) == reference.decode(ids, skip_special_tokens=False)
    assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)


def test_special_tokens_match_transformers(ours: Tokenizer, reference: Any) -> None:
    assert ours.bos_token_id == reference.bos_token_id
    assert ours.eos_token_id == reference.eos_token_id
    assert reference.eos_token_id in ours.eos_token_ids
    assert ours.vocab_size == len(reference)
    # Control tokens stay whole, one id each.
    assert ours.encode("<|im_start|><|im_end|><|endoftext|>") == [1, 2, 0]


def test_end_of_turn_tokens_stop_generation(ours: Tokenizer) -> None:
    assert {0, 2} <= ours.eos_token_ids  # <|endoftext|> ends a document, <|im_end|> a chat turn


def stream(tokenizer: Tokenizer, prompt: list[int], ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt)
    chunks = [detok.push(i) for i in ids]
    chunks.append(detok.flush())
    return chunks


@pytest.mark.parametrize("text", [t for t in TEXTS if t])
def test_stream_reassembles_the_full_text_without_broken_characters(ours: Tokenizer, text: str) -> None:
    prompt = ours.encode("Say:")
    ids = ours.encode(text, add_special_tokens=False)
    chunks = stream(ours, prompt, ids)
    assert "".join(chunks) == ours.decode(prompt + ids)[len(ours.decode(prompt)) :]
    assert not any("\ufffd" in c for c in chunks)


def test_emoji_split_across_byte_tokens_is_held_back_until_complete(ours: Tokenizer) -> None:
    ids = ours.encode("🦜", add_special_tokens=False)
    assert len(ids) > 1  # a rare emoji is spelled as several byte tokens
    detok = IncrementalDetokenizer(ours, ours.encode("Bird:"))
    chunks = [detok.push(i) for i in ids]
    assert chunks[:-1] == [""] * (len(ids) - 1)
    assert chunks[-1].endswith("🦜")
    assert detok.flush() == ""


def test_flush_releases_an_incomplete_character(ours: Tokenizer) -> None:
    ids = ours.encode("🦜", add_special_tokens=False)
    detok = IncrementalDetokenizer(ours, [])
    assert detok.push(ids[0]) == ""
    assert detok.flush() == "\ufffd"  # the bytes never completed: surface them rather than swallow them


def test_special_tokens_are_skipped_in_the_stream(ours: Tokenizer) -> None:
    ids = ours.encode("Hi<|im_end|> there", add_special_tokens=False)
    assert "".join(stream(ours, [], ids)) == "Hi there"


def test_first_token_keeps_its_leading_space(ours: Tokenizer) -> None:
    prompt = ours.encode("The capital of France is")
    ids = ours.encode(" Paris", add_special_tokens=False)
    assert "".join(stream(ours, prompt, ids)) == " Paris"


def test_hf_folder_tokenizer_reads_template_and_special_tokens(tmp_path: Path, ours: Tokenizer) -> None:
    vocab = {"<s>": 0, "</s>": 1, "a": 2, "b": 3, "ab": 4, "Ġ": 5}
    backend = HFTokenizer(BPE(vocab=vocab, merges=[("a", "b")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<s>", "</s>"])
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        '{"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": true}'
    )
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    tok = Tokenizer.from_hf_folder(tmp_path, max_context=128)
    assert tok.encode("abab") == [0, 4, 4]
    assert tok.eos_token_id == 1 and 1 in tok.eos_token_ids
    assert tok.apply_chat_template([{"role": "user", "content": "ab"}]) == "<s>ab"
    assert tok.decode([0, 4, 1]) == "ab"


@pytest.mark.parametrize("text", ["Hello, world!", "naïve café ✓ 🙂", "  two  spaces\nand a line"])
def test_token_bytes_spell_the_text_the_ids_decode_to(ours: Tokenizer, text: str) -> None:
    spelled = ours.token_bytes()
    assert b"".join(spelled[i] for i in ours.encode(text, add_special_tokens=False)) == text.encode()
    assert all(spelled[i] == b"" for i in ours.eos_token_ids)  # special tokens are never text


def test_sentencepiece_token_bytes_map_the_space_mark_and_byte_tokens(tmp_path: Path) -> None:
    vocab = {"<unk>": 0, "▁a": 1, "b": 2, "<0x0A>": 3}
    backend = HFTokenizer(BPE(vocab=vocab, merges=[]))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback()])
    backend.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_hf_folder(tmp_path, max_context=128)
    assert tok.token_bytes()[1:] == [b" a", b"b", b"\n"]


def test_unused_gguf_tokens_are_never_text(gguf_metadata: dict[str, Any]) -> None:
    # A vocabulary padded to the model's rows (llama.cpp's converter and ours mark the pads unused): a model that
    # samples one writes nothing, as llama.cpp renders it, and typed text that spells one stays plain text.
    size = len(gguf_metadata["tokenizer.ggml.tokens"])
    meta = {**gguf_metadata,
            "tokenizer.ggml.tokens": [*gguf_metadata["tokenizer.ggml.tokens"], f"[PAD{size}]", f"[PAD{size + 1}]"],
            "tokenizer.ggml.token_type": [*gguf_metadata["tokenizer.ggml.token_type"], 5, 5]}
    tok = Tokenizer.from_gguf_metadata(meta, max_context=8192)
    hello = tok.encode("Hello", add_special_tokens=False)
    assert tok.decode([*hello, size, size + 1, *hello]) == "HelloHello"
    assert "".join(stream(tok, [], [size, *hello, size + 1])) == "Hello"
    assert tok.token_bytes()[size:] == [b"", b""]
    assert size not in tok.encode(f"[PAD{size}]", add_special_tokens=False)
