"""Byte-level BPE (`tokenizer.ggml.model == "gpt2"`): vocabulary and merges from the file, GPT-2's byte alphabet."""

from __future__ import annotations

from functools import cache
from typing import Any

from tokenizers import Tokenizer, decoders
from tokenizers.models import BPE

from backend.loading.gguf.tokenizer.pretokenizers import byte_level_pre_tokenizer


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


def byte_level_bpe(meta: dict[str, Any]) -> Tokenizer:
    """The BPE model with the split `tokenizer.ggml.pre` names; tokens outside the alphabet are respelled in it."""
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {
        tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8")): idx
        for idx, tok in enumerate(meta["tokenizer.ggml.tokens"])
    }
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    tokenizer = Tokenizer(
        BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    )
    tokenizer.pre_tokenizer = byte_level_pre_tokenizer(meta.get("tokenizer.ggml.pre"))
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer

