"""A local tokenizer for counting tokens and building prompts of an exact token length.

A remote server's tokenizer is out of reach, so lengths are measured with one loaded here: the default
SmolLM2 GGUF from the model cache, or `--tokenizer PATH` (a tokenizer.json, a Hugging Face folder, or a
.gguf file). Prompts are random vocabulary words, so two requests share no prefix by accident.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from random import Random

from tokenizers import Tokenizer

# A word token: optional leading space (or SentencePiece's marker) then lowercase letters.
_WORD = re.compile(r"^ ?[a-z]{2,12}$")
_FIX_ROUNDS = 8


class TokenizerError(RuntimeError):
    """No tokenizer could be loaded, or it cannot produce prompts of exact length."""


class PromptTokenizer:
    """Counts tokens and writes random text of exactly `n` tokens."""

    def __init__(self, tokenizer: Tokenizer, name: str) -> None:
        self._tok = tokenizer
        self.name = name
        self._words = self._word_pool()
        if len(self._words) < 100:
            raise TokenizerError(f"tokenizer {name} has too few plain word tokens to build prompts")

    def _word_pool(self) -> list[str]:
        # keep only words that come back as themselves, so a sequence of them re-encodes token for token
        size = self._tok.get_vocab_size()
        texts = self._tok.decode_batch([[i] for i in range(size)])
        candidates = [(i, " " + t.lstrip()) for i, t in enumerate(texts) if _WORD.match(t)]
        encoded = self._tok.encode_batch([t for _, t in candidates], add_special_tokens=False)
        return [text for (i, text), enc in zip(candidates, encoded, strict=True) if enc.ids == [i]]

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def random_text(self, n: int, rng: Random) -> str:
        """Text of exactly `n` tokens under this tokenizer."""
        if n <= 0:
            return ""
        words = rng.choices(self._words, k=n)
        for _ in range(_FIX_ROUNDS):
            text = "".join(words)
            have = self.count(text)
            if have == n:
                return text
            if have > n:
                del words[-max(1, have - n) :]
            else:
                words.extend(rng.choices(self._words, k=n - have))
        raise TokenizerError(f"could not build a prompt of exactly {n} tokens with {self.name}")


@functools.cache
def load_tokenizer(path: Path | None = None) -> PromptTokenizer:
    """Load `path` (tokenizer.json, HF folder or .gguf), or the default SmolLM2 GGUF when None.

    Cached per path: a sweep, or a script running several benchmarks, pays for loading once.
    """
    if path is None:
        from backend.loading.model_cache import cached_path

        path = cached_path("smollm2")
        if not path.exists():
            raise TokenizerError(
                f"no tokenizer: {path} is missing (run `tidegate model pull smollm2` or pass --tokenizer)")
    path = Path(path).expanduser()
    if path.is_dir() and (path / "tokenizer.json").exists():
        path = path / "tokenizer.json"
    if not path.exists():
        raise TokenizerError(f"tokenizer {path} does not exist")
    if path.suffix == ".json":
        return PromptTokenizer(Tokenizer.from_file(str(path)), path.name)
    if path.suffix != ".gguf":
        raise TokenizerError(f"tokenizer {path}: expected a tokenizer.json, a folder holding one, or a .gguf")
    return PromptTokenizer(_gguf_tokenizer(path), path.name)


def _gguf_tokenizer(path: Path) -> Tokenizer:
    # transformers' GGUF conversion takes seconds, so its result is kept as a tokenizer.json
    stat = path.stat()
    cache_root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tidegate" / "tokenizers"
    cached = cache_root / f"{path.stem}-{stat.st_size}-{int(stat.st_mtime)}.json"
    if cached.exists():
        return Tokenizer.from_file(str(cached))
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot load a tokenizer from {path}: {exc}") from exc
    tokenizer: Tokenizer = hf.backend_tokenizer
    cache_root.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.partial")
    tokenizer.save(str(partial))
    partial.replace(cached)  # atomic, so concurrent first loads never read half a file
    return tokenizer
