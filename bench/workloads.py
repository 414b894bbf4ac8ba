"""What the load generator sends: synthetic prompts of exact token lengths, shared prefixes, multi-turn
conversations, input-grounded tasks (edit or summarise a passage of a shipped public-domain text), real
chat turns and questions answered until the model's own end (bench/realistic.py), or prompts read from a
JSONL file.

Every workload yields conversations; a single-turn request is a conversation of one turn, so the load
generator has one unit of work.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from random import Random
from typing import Any, cast

from bench.realistic import realistic_set
from bench.tokenizer import PromptTokenizer

Message = dict[str, str]
GROUNDED_TEXT = Path(__file__).parent / "data" / "alice_chapter1.txt"  # Lewis Carroll, 1865: public domain
_ENDS = (".", "!", "?", '."', '!"', '?"')
GROUNDED_TASKS = (
    "Copy the following text exactly, word for word:",
    "Rewrite the following text with each sentence on a line of its own, changing no words:",
    "Correct any spelling or punctuation mistakes in the following text and return the whole text:",
    "Summarise the following text, quoting its most important sentences:",
)


class WorkloadError(ValueError):
    """A workload that cannot be built (bad lengths, a malformed dataset line)."""


@dataclass(slots=True)
class RequestSpec:
    """One request's content: a text prompt (or chat messages from a dataset) and its output length."""

    prompt: str | list[Message]
    input_tokens: int  # locally counted; 0 when unknown
    output_len: int | None  # None leaves max_tokens to the server
    system: str | None = None  # a system prompt sent ahead of every turn of the conversation
    natural: bool = False  # a real prompt: answered until EOS, sent as User:/Assistant: lines on /v1/completions


Conversation = list[RequestSpec]


@dataclass(slots=True)
class WorkloadSpec:
    """Lengths are in tokens; `input_len` includes the shared prefix when there is one."""

    input_len: int = 256
    output_len: int = 128
    range_ratio: float = 0.0
    shared_prefix_len: int = 0
    num_prefixes: int = 1
    turns: int = 1
    dataset: Path | None = None
    system_prompt_len: int = 0  # tokens of a system prompt (one of num_prefixes) at the head of each conversation
    grounded: bool = False  # edit or summarise a passage of GROUNDED_TEXT instead of random words
    realistic: bool = False  # the shipped real set, answers ending at EOS with output_len as their cap

    def __post_init__(self) -> None:
        if self.input_len < 1 or self.output_len < 1:
            raise WorkloadError("--input-len and --output-len must be at least 1")
        if not 0.0 <= self.range_ratio < 1.0:
            raise WorkloadError("--range-ratio must be in [0, 1)")
        if self.shared_prefix_len < 0 or self.num_prefixes < 1:
            raise WorkloadError("--shared-prefix-len must be >= 0 and --num-prefixes >= 1")
        if self.shared_prefix_len and self.shared_prefix_len >= self.input_len * (1 - self.range_ratio):
            raise WorkloadError("--shared-prefix-len must be shorter than the shortest --input-len")
        if self.system_prompt_len < 0:
            raise WorkloadError("--system-prompt-len must be >= 0")
        if self.turns < 1:
            raise WorkloadError("--multi-turn must be at least 1")
        if self.grounded and (self.dataset is not None or self.shared_prefix_len or self.system_prompt_len
                              or self.turns > 1):
            raise WorkloadError(
                "--workload grounded takes none of --dataset, --shared-prefix-len, --system-prompt-len, --multi-turn")
        if self.realistic and (self.grounded or self.dataset is not None or self.shared_prefix_len
                               or self.system_prompt_len or self.turns > 1):
            raise WorkloadError("--workload realistic takes none of --dataset, --shared-prefix-len, "
                                "--system-prompt-len, --multi-turn (its prompts and turns come from its set)")


class Workload:
    """An endless, seeded stream of conversations built from a `WorkloadSpec`."""

    def __init__(self, spec: WorkloadSpec, tokenizer: PromptTokenizer | None, seed: int = 0) -> None:
        if spec.dataset is None and not spec.realistic and tokenizer is None:
            raise WorkloadError("synthetic prompts need a tokenizer")
        self.spec = spec
        self.tokenizer = tokenizer
        self.rng = Random(seed)
        self._dataset = read_dataset(spec.dataset, spec.output_len) if spec.dataset else None
        self._grounded_words = GROUNDED_TEXT.read_text(encoding="utf-8").split() if spec.grounded else []
        self._prefixes = [self._text(spec.shared_prefix_len) for _ in range(spec.num_prefixes)] \
            if spec.shared_prefix_len else []
        self._systems = [self._text(spec.system_prompt_len) for _ in range(spec.num_prefixes)] \
            if spec.system_prompt_len else []

    def _text(self, n: int) -> str:
        assert self.tokenizer is not None
        return self.tokenizer.random_text(n, self.rng)

    def _length(self, mean: int) -> int:
        low = max(1, round(mean * (1 - self.spec.range_ratio)))
        high = max(low, round(mean * (1 + self.spec.range_ratio)))
        return self.rng.randint(low, high)

    def _synthetic(self) -> RequestSpec:
        n_in = self._length(self.spec.input_len)
        if self._prefixes:
            prefix = self.rng.choice(self._prefixes)
            prompt = prefix + self._text(n_in - self.spec.shared_prefix_len)
        else:
            prompt = self._text(n_in)
        # joining word tokens keeps the count additive; dataset prompts are counted instead
        return RequestSpec(prompt, n_in, self._length(self.spec.output_len))

    def _grounded(self) -> RequestSpec:
        """A task over a passage that starts at a random sentence, about the input length in tokens."""
        assert self.tokenizer is not None
        task = self.rng.choice(GROUNDED_TASKS)
        words = self._grounded_words
        start = self.rng.choice([0, *(i for i in range(1, len(words)) if words[i - 1].rstrip().endswith(_ENDS))])
        want = self._length(self.spec.input_len) - self.tokenizer.count(task + "\n\n")
        # a word is at least one token: take `want` words, then cut by the measured tokens per word
        passage = (words[start:] + words)[: max(1, want)]  # past the chapter's end, from its start again
        per_word = self.tokenizer.count(" ".join(passage)) / len(passage)
        passage = passage[: max(1, int(want / per_word))]
        prompt = f"{task}\n\n{' '.join(passage)}"
        return RequestSpec(prompt, self.tokenizer.count(prompt), self._length(self.spec.output_len))

    def _realistic(self) -> Conversation:
        """A conversation of the shipped set; every turn's output is capped at output_len, not forced to it."""
        real = self.rng.choice(realistic_set())
        # input tokens of later turns include the history, whose answers are known only at run time:
        # the local count is the turn alone, and the server's usage replaces it
        return [RequestSpec(turn, self.tokenizer.count(turn) if self.tokenizer else 0, self.spec.output_len,
                            real.system, natural=True) for turn in real.turns]

    def conversations(self) -> Iterator[Conversation]:
        if self._dataset is not None:
            while True:  # cycles the file, so a duration-bounded run never runs dry
                for spec in self._dataset:
                    yield [self._counted(spec)]
        if self.spec.realistic:
            while True:
                yield self._realistic()
        if self.spec.grounded:
            while True:
                yield [self._grounded()]
        while True:
            turns = [self._synthetic() for _ in range(self.spec.turns)]
            if self._systems:
                system = self.rng.choice(self._systems)
                for turn in turns:
                    turn.system = system
                    turn.input_tokens += self.spec.system_prompt_len
            yield turns

    def _counted(self, spec: RequestSpec) -> RequestSpec:
        if spec.input_tokens or self.tokenizer is None:
            return spec
        prompt = spec.prompt
        text = prompt if isinstance(prompt, str) else "".join(m.get("content", "") for m in prompt)
        spec.input_tokens = self.tokenizer.count(text)
        return spec


def read_dataset(path: Path, default_output_len: int | None) -> list[RequestSpec]:
    """Read JSONL lines of `{"prompt": str}` or `{"messages": [...]}`, with an optional `output_len`."""
    specs = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise WorkloadError(f"cannot read dataset {path}: {exc}") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{number}: not JSON ({exc.msg})") from None
        specs.append(_row_spec(row, default_output_len, f"{path}:{number}"))
    if not specs:
        raise WorkloadError(f"dataset {path} holds no prompts")
    return specs


def _row_spec(row: Any, default_output_len: int | None, where: str) -> RequestSpec:
    if not isinstance(row, dict):
        raise WorkloadError(f"{where}: expected an object with a prompt or messages")
    prompt = row.get("prompt", row.get("messages"))
    valid_messages = isinstance(prompt, list) and prompt and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in prompt)
    if not (isinstance(prompt, str) and prompt) and not valid_messages:
        raise WorkloadError(f"{where}: needs a non-empty 'prompt' string or 'messages' list of role/content")
    output_len = row.get("output_len", row.get("max_tokens", default_output_len))
    if output_len is not None and (not isinstance(output_len, int) or isinstance(output_len, bool)
                                   or output_len < 1):
        raise WorkloadError(f"{where}: output_len must be a positive integer")
    return RequestSpec(cast(str | list[Message], prompt), 0, output_len)
