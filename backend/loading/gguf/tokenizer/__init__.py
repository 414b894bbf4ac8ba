"""Building a `tokenizers` tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.

`tokenizer.ggml.model` picks the model: "gpt2" is byte-level BPE (`bpe.py`, split as `tokenizer.ggml.pre` names,
`pretokenizers.py`), "llama" is SentencePiece (`sentencepiece.py`). Either way the tokens the file marks as control
become special tokens and user-defined ones plain added tokens, so both stay whole in text, as in llama.cpp.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenizers import AddedToken, Tokenizer

from backend.executor.model.config import UnsupportedModelError
from backend.loading.gguf.tokenizer.bpe import byte_alphabet, byte_level_bpe
from backend.loading.gguf.tokenizer.sentencepiece import sentencepiece_bpe

__all__ = ["UNUSED", "build_gguf_tokenizer", "byte_alphabet"]

# llama.cpp's token types (gguf.TokenType).
UNKNOWN, CONTROL, USER_DEFINED, UNUSED = 2, 3, 4, 5

_BUILDERS: dict[str, Callable[[dict[str, Any]], Tokenizer]] = {"gpt2": byte_level_bpe, "llama": sentencepiece_bpe}


def build_gguf_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    """The file's tokenizer; a tokenizer model other than "gpt2" or "llama" fails naming itself."""
    kind = meta.get("tokenizer.ggml.model")
    builder = _BUILDERS.get(str(kind))
    if builder is None:
        raise UnsupportedModelError(
            f"unsupported GGUF tokenizer model {kind!r}; supported: 'gpt2' (byte-level BPE), 'llama' (SentencePiece)"
        )
    tokenizer = builder(meta)
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [])
    special = {CONTROL} if kind == "gpt2" else {CONTROL, UNKNOWN}
    # A byte-level "control" token spelled outside the byte alphabet is a llama.cpp mislabel; adding it would
    # grow the vocabulary past the model's.
    alphabet = set(byte_alphabet().values()) if kind == "gpt2" else None
    tokenizer.add_special_tokens(
        [
            AddedToken(tok, normalized=False, special=True)
            for tok, type_ in zip(tokens, types, strict=False)
            if type_ in special and (alphabet is None or set(tok) <= alphabet)
        ]
    )
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    tokenizer.add_tokens(
        [
            AddedToken(tok, normalized=False, special=False)
            for tok, type_ in zip(tokens, types, strict=False)
            if type_ == USER_DEFINED and tok in vocab
        ]
    )
    return tokenizer
