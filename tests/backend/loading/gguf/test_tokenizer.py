"""GGUF tokenizers other than the default model's: SentencePiece and byte-level BPE with each pre-tokenizer, built
here from real tokenizers, written to GGUF as llama.cpp's converter does, and compared with the originals."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from tokenizers import AddedToken

from backend.executor.model.config import UnsupportedModelError
from backend.loading.gguf.tokenizer.pretokenizers import PRE_SPLITS
from backend.loading.tokenizer import IncrementalDetokenizer, Tokenizer
from tests.backend.loading.gguf.vocab_files import (
    TEXTS,
    byte_level_fields,
    sentencepiece_fields,
    train_byte_level_bpe,
    train_sentencepiece,
    write_gguf,
)

pytest.importorskip("sentencepiece")

SPECIALS = ["<s>", "</s>", "<|end|>", "<|user|>"]
_SPECIAL_SPLIT = "(" + "|".join(map(re.escape, SPECIALS)) + ")"
WITH_SPECIALS = [
    "<s>Hello</s> again",
    "<|user|>What is 2+2?<|end|>\n<|user|> and then",
    "special<|end|>inside<|user|>text",
]


def prefixed_runs(text: str) -> str:
    """`text` with one more space before every run of text that starts with whitespace.

    transformers' Metaspace adds no "▁" to a run of text (at the start, or after a special token) that already
    starts with a space; SentencePiece and llama.cpp always do. This gives transformers that "▁" as a space."""
    return "".join(" " + p if p[:1].isspace() else p for p in re.split(_SPECIAL_SPLIT, text))


@pytest.fixture(scope="module")
def llama_sp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Tokenizer]:
    """(sentencepiece processor, transformers' LlamaTokenizer, ours) for one Llama-style vocabulary."""
    import sentencepiece as spm
    from transformers import LlamaTokenizer

    folder = tmp_path_factory.mktemp("llama_sp")
    model_file = train_sentencepiece(folder, dummy_prefix=True)
    # legacy=True: Llama 2's own tokenizer, which puts the "▁" prefix after special tokens too (as llama.cpp does).
    reference = LlamaTokenizer.from_pretrained(str(folder), legacy=True, add_bos_token=True)
    added = {i: t.special for i, t in reference.added_tokens_decoder.items() if i > 2}
    fields = sentencepiece_fields(model_file, added, add_bos=True)
    template = "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
    meta = write_gguf(folder / "vocab.gguf", "llama", {**fields, "add_space_prefix": True, "chat_template": template})
    ours = Tokenizer.from_gguf_metadata(meta, max_context=4096)
    return spm.SentencePieceProcessor(model_file=str(model_file)), reference, ours


@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_ids_equal_sentencepiece_itself(llama_sp: tuple[Any, Any, Tokenizer], text: str) -> None:
    sp, _, ours = llama_sp
    assert ours.encode(text, add_special_tokens=False) == sp.encode(text)
    assert ours.encode(text) == [sp.bos_id(), *sp.encode(text)]
    assert ours.decode(ours.encode(text)) == sp.decode(sp.encode(text))


@pytest.mark.parametrize("text", TEXTS + WITH_SPECIALS)
def test_sentencepiece_equals_transformers(llama_sp: tuple[Any, Any, Tokenizer], text: str) -> None:
    _, reference, ours = llama_sp
    ids = ours.encode(text)
    assert ids == reference(prefixed_runs(text))["input_ids"]
    assert ours.decode(ids, skip_special_tokens=False) == reference.decode(ids, skip_special_tokens=False)
    assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("text", WITH_SPECIALS)
def test_sentencepiece_with_special_tokens_equals_llama_cpp(llama_sp: tuple[Any, Any, Tokenizer], text: str) -> None:
    sp, _, ours = llama_sp
    # llama.cpp: special tokens whole, and each run of text between them encoded with its own "▁" prefix.
    expected = [sp.bos_id()]
    for part in re.split(_SPECIAL_SPLIT, text):
        expected += [sp.piece_to_id(part)] if part in SPECIALS else sp.encode(part) if part else []
    assert ours.encode(text) == expected


def test_sentencepiece_special_and_added_tokens_stay_whole(llama_sp: tuple[Any, Any, Tokenizer]) -> None:
    _, reference, ours = llama_sp
    end, user = reference.convert_tokens_to_ids(["<|end|>", "<|user|>"])
    assert ours.encode("<|user|><|end|></s>", add_special_tokens=False) == [user, end, 2]
    assert ours.decode([user, end, 2]) == "<|user|>"  # control tokens are skipped, user-defined ones are text
    assert {ours.bos_token_id, ours.eos_token_id} == {1, 2} and 2 in ours.eos_token_ids
    assert ours.vocab_size == len(reference)


def test_sentencepiece_stream_and_token_bytes_spell_the_text(llama_sp: tuple[Any, Any, Tokenizer]) -> None:
    _, _, ours = llama_sp
    text = "Line one\n  naïve 🦜 中文 ẞ"
    prompt = ours.encode("Say:")
    ids = ours.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(ours, prompt)
    chunks = [detok.push(i) for i in ids] + [detok.flush()]
    assert "".join(chunks) == " " + text and not any("\ufffd" in c for c in chunks)
    spelled = ours.token_bytes()
    assert b"".join(spelled[i] for i in ids) == (" " + text).encode()


def test_chat_prompt_gets_one_bos_whether_or_not_the_template_writes_it(llama_sp: tuple[Any, Any, Tokenizer]) -> None:
    _, _, ours = llama_sp
    bos, messages = ours.bos_token_id, [{"role": "user", "content": "hi"}]
    assert ours.chat_template is not None
    rendered = ours.apply_chat_template(messages)
    assert rendered == "<s>[INST] hi [/INST]"  # the file's template writes BOS itself
    ids = ours.encode_chat(rendered)
    assert ids[0] == bos and ids.count(bos) == 1
    assert ours.encode_chat("[INST] hi [/INST]") == ids  # a template without it still gets the model's BOS


@pytest.fixture(scope="module")
def gemma_sp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Tokenizer]:
    """transformers' GemmaTokenizer and ours for a vocabulary without the space prefix, as Gemma's."""
    from transformers import GemmaTokenizer

    folder = tmp_path_factory.mktemp("gemma_sp")
    model_file = train_sentencepiece(folder, dummy_prefix=False)
    reference = GemmaTokenizer.from_pretrained(str(folder), add_bos_token=True)
    added = {i: t.special for i, t in reference.added_tokens_decoder.items() if i > 2}
    fields = sentencepiece_fields(model_file, added, add_bos=True)
    # Gemma's converter writes spaces as spaces; its merge order is the file's.
    fields["token_list"] = [t.replace("\u2581", " ") if not t.strip("\u2581") else t for t in fields["token_list"]]
    meta = write_gguf(folder / "vocab.gguf", "gemma2", {**fields, "add_space_prefix": False})
    return reference, Tokenizer.from_gguf_metadata(meta, max_context=4096)


@pytest.mark.parametrize("text", TEXTS + WITH_SPECIALS)
def test_gemma_style_sentencepiece_equals_transformers(gemma_sp: tuple[Any, Tokenizer], text: str) -> None:
    reference, ours = gemma_sp
    ids = ours.encode(text, add_special_tokens=False)
    assert ids == reference(text, add_special_tokens=False)["input_ids"]
    assert ours.decode(ids, skip_special_tokens=False) == reference.decode(ids, skip_special_tokens=False)


# One vocabulary per distinct split llama.cpp names (the names sharing a split share its test).
PRE_CASES = {"default": None, "llama-bpe": PRE_SPLITS["llama-bpe"], "qwen2": PRE_SPLITS["qwen2"],
             "smollm": PRE_SPLITS["smollm"], "falcon": PRE_SPLITS["falcon"], "tekken": PRE_SPLITS["tekken"],
             "gpt-4o": PRE_SPLITS["gpt-4o"]}
CONTROL, USER = ["<|begin|>", "<|end|>"], ["<think>"]


@pytest.fixture(scope="module", params=sorted(PRE_CASES))
def byte_level(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Tokenizer]:
    """transformers' PreTrainedTokenizerFast over a BPE trained with one split, and ours from its GGUF."""
    from transformers import PreTrainedTokenizerFast

    pre = request.param
    trained = train_byte_level_bpe(PRE_CASES[pre], CONTROL)
    trained.add_tokens([AddedToken(t, normalized=False, special=False) for t in USER])
    reference = PreTrainedTokenizerFast(tokenizer_object=trained, bos_token=CONTROL[0], eos_token=CONTROL[1])
    folder = tmp_path_factory.mktemp(f"bpe_{pre}")
    meta = write_gguf(folder / "vocab.gguf", "llama", byte_level_fields(trained, pre, CONTROL, USER))
    return reference, Tokenizer.from_gguf_metadata(meta, max_context=4096)


@pytest.mark.parametrize("text", [*TEXTS, "<|begin|>hi<think> 12345<|end|>  x"])
def test_byte_level_bpe_equals_transformers_for_each_pre_tokenizer(
    byte_level: tuple[Any, Tokenizer], text: str
) -> None:
    reference, ours = byte_level
    ids = ours.encode(text)
    assert ids == reference(text)["input_ids"]
    assert ours.decode(ids, skip_special_tokens=False) == reference.decode(ids, skip_special_tokens=False)
    assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)


def test_unknown_pre_tokenizer_loads_with_a_warning_naming_it(caplog: pytest.LogCaptureFixture) -> None:
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "brand-new", "tokenizer.ggml.tokens": ["a", "b"]}
    with caplog.at_level(logging.WARNING):
        tok = Tokenizer.from_gguf_metadata(meta, max_context=16)
    assert "'brand-new'" in caplog.text
    assert tok.encode("ab") == [0, 1]


@pytest.mark.parametrize("model", ["t5", "rwkv", None])
def test_unknown_tokenizer_model_is_refused_naming_it(model: str | None) -> None:
    meta = {"tokenizer.ggml.model": model, "tokenizer.ggml.tokens": ["<unk>"]}
    with pytest.raises(UnsupportedModelError, match=f"tokenizer model {model!r}") as info:
        Tokenizer.from_gguf_metadata(meta, max_context=16)
    assert "\n" not in str(info.value)


