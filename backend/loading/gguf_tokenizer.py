"""Building a `tokenizers` BPE tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.

Mirrors transformers' GGUF tokenizer conversion so that ids match `AutoTokenizer.from_pretrained(dir,
gguf_file=...)`: byte-level BPE from the vocabulary and merges, the split regex named by `tokenizer.ggml.pre`,
control tokens added as special tokens and user-defined ones as plain added tokens.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE

from backend.executor.model.config import UnsupportedModelError

_CONTROL, _USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` names whose merges were learned on a non-GPT-2 split; others use GPT-2's own regex.
_PRE_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}


@cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def build_gguf_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    """A byte-level BPE tokenizer from GGUF metadata; other tokenizer models fail naming themselves."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise UnsupportedModelError(f"unsupported GGUF tokenizer model {kind!r}; supported: 'gpt2' (byte-level BPE)")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [])
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {
        tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8")): idx
        for idx, tok in enumerate(tokens)
    }
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    tokenizer = Tokenizer(
        BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    )
    split = _PRE_SPLITS.get(str(meta.get("tokenizer.ggml.pre")))
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    # A "control" token spelled outside the byte alphabet is a llama.cpp mislabel; adding it would grow the vocab.
    control = [
        AddedToken(tok, normalized=False, special=True)
        for tok, kind_ in zip(tokens, types, strict=False)
        if kind_ == _CONTROL and set(tok) <= alphabet
    ]
    tokenizer.add_special_tokens(control)
    user = [
        AddedToken(tok, normalized=False, special=False)
        for tok, kind_ in zip(tokens, types, strict=False)
        if kind_ == _USER_DEFINED and tok in vocab
    ]
    tokenizer.add_tokens(user)
    return tokenizer
