"""SentencePiece vocabularies (`tokenizer.ggml.model == "llama"`: Llama 2, Mistral, Gemma, Phi-3) as `tokenizers` BPE.

SentencePiece's BPE merges, at each step, the adjacent pair whose joined piece scores highest. A `tokenizers` BPE
whose merges are ranked by the score of the piece they make does the same, so the merges are derived from the
scores; byte fallback spells a character outside the vocabulary as `<0xHH>` tokens. Text is normalized as
llama.cpp and SentencePiece do: spaces become "▁" and, with `tokenizer.ggml.add_space_prefix` (default true),
"▁" is prepended to every run of text, also after a special token.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer, decoders, normalizers
from tokenizers.models import BPE

SPACE = "\u2581"
# Token types (gguf.TokenType) whose pieces never take part in a merge.
_NOT_MERGED = {2, 3, 5, 6}  # unknown, control, unused, byte


def sentencepiece_bpe(meta: dict[str, Any]) -> Tokenizer:
    """The BPE model, normalizer and decoder of the file's SentencePiece vocabulary."""
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    scores: list[float] = list(meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
    if str(meta.get("general.architecture", "")).startswith("gemma"):
        # Gemma stores runs of spaces as spaces, and its merge order is the file's order, not its scores.
        tokens = [SPACE * len(t) if t and not t.strip(" ") else t for t in tokens]
        scores = [-float(i) for i in range(len(tokens))]
    vocab: dict[str, int] = {}
    for idx, tok in enumerate(tokens):
        vocab.setdefault(tok, idx)
    given = meta.get("tokenizer.ggml.merges")
    merges = [tuple(m.split(" ", 1)) for m in given] if given else derive_merges(tokens, types, scores, vocab)
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unk_id)] if unk_id is not None and 0 <= int(unk_id) < len(tokens) else None
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True, dropout=None))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    to_space = normalizers.Replace(" ", SPACE)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), to_space]) if prefix else to_space
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    # The prefix space is not part of the text: decoding drops it again.
    tokenizer.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    return tokenizer


def derive_merges(
    tokens: list[str], types: list[int], scores: list[float], vocab: dict[str, int]
) -> list[tuple[str, str]]:
    """Every split of a mergeable piece into two mergeable pieces, best-scoring piece first."""
    mergeable = {tok for tok, type_ in zip(tokens, types, strict=False) if type_ not in _NOT_MERGED}
    ranked: list[tuple[float, int, str, str]] = []
    for tok in mergeable:
        idx = vocab[tok]
        for cut in range(1, len(tok)):
            left, right = tok[:cut], tok[cut:]
            if left in mergeable and right in mergeable:
                ranked.append((-scores[idx], idx, left, right))
    ranked.sort()  # one piece's cuts tie on score and id: the shorter left part, the earlier cut, comes first
    return [(left, right) for _, _, left, right in ranked]
