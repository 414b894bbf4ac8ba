"""How a byte-level BPE splits text before merging, by llama.cpp's `tokenizer.ggml.pre` name.

Each entry holds the regexes llama.cpp's `llama-vocab.cpp` applies in turn (each one cuts the pieces the
previous one left); `None` means GPT-2's own split, which `ByteLevel` applies itself.
"""

from __future__ import annotations

import logging

from tokenizers import Regex, pre_tokenizers

log = logging.getLogger(__name__)

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Digits one by one, then GPT-2's split (StarCoder's tokenizer and those trained like it).
_DIGITS_THEN_GPT2 = (r"\p{N}", _GPT2)

PRE_SPLITS: dict[str, tuple[str, ...] | None] = {
    **dict.fromkeys(("default", "gpt2", "mpt", "olmo", "jais", "trillion"), None),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3", "falcon-h1", "pixtral", "lfm2"), (_LLAMA3,)
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), (_QWEN2,)),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"), _DIGITS_THEN_GPT2
    ),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    "tekken": (_TEKKEN,),
    **dict.fromkeys(("gpt-4o", "llama4"), (_GPT4O,)),
}


def byte_level_pre_tokenizer(name: str | None) -> pre_tokenizers.PreTokenizer:
    """The splits `name` stands for, then GPT-2's byte-to-character map; an unknown name warns and splits as GPT-2."""
    if name is not None and name not in PRE_SPLITS:
        log.warning("GGUF tokenizer.ggml.pre %r is not known; splitting text as GPT-2 does", name)
    splits = PRE_SPLITS.get(name or "default")
    if splits is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    steps: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in splits
    ]
    return pre_tokenizers.Sequence([*steps, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
