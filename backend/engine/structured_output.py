"""Structured output: constraints compiled to token grammars (xgrammar), cached, and matched per sequence.

xgrammar over llguidance because its per-step mask fill is cheaper on this vocabulary (docs/benchmarks.md,
`benchmarks.grammar_mask`); both share the packed int32 bitmask that `backend.executor.sample.token_mask` applies.
Compiling runs in worker threads with a deadline, never on the step loop, and each constraint is compiled once:
a bounded LRU keyed by a digest of its kind and source.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import xgrammar as xgr

if TYPE_CHECKING:
    import torch

    from backend.loading.tokenizer import Tokenizer

COMPILE_TIMEOUT_S = 10.0
CACHE_SIZE = 256
COMPILE_WORKERS = 2
MAX_PENDING = 8  # distinct constraints compiling or queued; beyond it new ones are refused at once
_ANY_OBJECT = '{"type": "object"}'
_SOURCE_LOCATION = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # xgrammar's "[12:00:00] file.cc:94: " prefix


class ConstraintKind(Enum):
    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    CHOICE = "choice"
    GRAMMAR = "grammar"  # xgrammar's EBNF (GBNF-style)
    STRUCTURAL_TAG = "structural_tag"  # xgrammar's structural tag (JSON): tool-call blocks


@dataclass(slots=True, frozen=True)
class Constraint:
    """What a request's output must match; `source` is the schema (as JSON), regex, choices (as JSON) or EBNF.

    `field` names the request field it came from, so a refusal can name it."""

    kind: ConstraintKind
    source: str
    field: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(f"{self.kind.value}\0{self.source}".encode()).hexdigest()


class ConstraintError(ValueError):
    """The constraint cannot be compiled; the message says why and `field` names the request field."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class CompileTimeout(ConstraintError):
    """Compiling took longer than the deadline; the compile finishes in the background and is cached."""


class CompilerBusy(Exception):
    """Too many distinct constraints are compiling already; the caller should retry later."""


class GrammarState:
    """One sequence's position in its grammar: fills its row of the step's bitmask and accepts sampled tokens."""

    __slots__ = ("_matcher",)

    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        """Advance by the sampled token; False if the grammar refuses it (the mask should have prevented it)."""
        return bool(self._matcher.accept_token(token_id))

    def fork(self) -> GrammarState:
        """An independent copy at the same position (for choices that share a prompt, such as n > 1)."""
        copy = GrammarState.__new__(GrammarState)
        copy._matcher = self._matcher.fork()
        return copy

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and accepted its stop token: nothing more may follow."""
        return bool(self._matcher.is_terminated())


class GrammarCompiler:
    """Compiles constraints for one tokenizer, at most once per digest, within a deadline."""

    def __init__(self, tokenizer: Tokenizer, *, cache_size: int = CACHE_SIZE,
                 timeout: float = COMPILE_TIMEOUT_S) -> None:
        self._tokenizer = tokenizer
        self._compiler: xgr.GrammarCompiler | None = None  # built on first use: engines that never constrain skip it
        self._timeout = timeout
        self._cache_size = cache_size
        self._cache: OrderedDict[str, xgr.CompiledGrammar] = OrderedDict()
        self._pending: dict[str, Future[xgr.CompiledGrammar]] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(COMPILE_WORKERS, thread_name_prefix="tidegate-grammar")

    def state_for(self, constraint: Constraint) -> GrammarState:
        """A fresh matcher for `constraint`; raises ConstraintError or CompileTimeout. Blocks up to the
        deadline: call it off the event loop and off the step loop."""
        return GrammarState(self.compiled(constraint))

    def compiled(self, constraint: Constraint) -> xgr.CompiledGrammar:
        key = constraint.digest
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            future = self._pending.get(key)
            started = future is None
            if future is None and len(self._pending) >= MAX_PENDING:  # slow schemas must not queue up unbounded
                raise CompilerBusy(f"{len(self._pending)} output constraints are compiling")
            if future is None:  # one compile per digest, however many requests wait for it
                future = self._pool.submit(self._compile, constraint)
                self._pending[key] = future
        if started:  # outside the lock: a compile already done runs its callback in this thread
            future.add_done_callback(lambda done: self._store(key, done))
        try:
            return future.result(timeout=self._timeout)
        except FutureTimeout:
            raise CompileTimeout(f"`{constraint.field}` took longer than {self._timeout:g}s to compile",
                                 constraint.field) from None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _compile(self, constraint: Constraint) -> xgr.CompiledGrammar:
        try:
            with self._lock:
                if self._compiler is None:
                    info = tokenizer_info(self._tokenizer)
                    self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return _compile_with(self._compiler, constraint)
        except Exception as exc:  # xgrammar raises RuntimeError and ValueError subclasses with the reason
            lines = str(exc).strip().splitlines()
            reason = _SOURCE_LOCATION.sub("", lines[0]) if lines else type(exc).__name__
            raise ConstraintError(f"`{constraint.field}` cannot be compiled: {reason[:300]}",
                                  constraint.field) from None

    def _store(self, key: str, done: Future[xgr.CompiledGrammar]) -> None:
        with self._lock:
            self._pending.pop(key, None)
            if done.cancelled() or done.exception() is not None:
                return
            self._cache[key] = done.result()
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)


def _compile_with(compiler: xgr.GrammarCompiler, constraint: Constraint) -> xgr.CompiledGrammar:
    kind, source = constraint.kind, constraint.source
    if kind in (ConstraintKind.JSON_SCHEMA, ConstraintKind.JSON_OBJECT):
        # Compact JSON: free whitespace lets a small model pad with newlines until max_tokens.
        # Strict mode (no properties beyond the schema's) for schemas; json_object allows any properties.
        strict = kind is ConstraintKind.JSON_SCHEMA
        return compiler.compile_json_schema(source or _ANY_OBJECT, any_whitespace=False, strict_mode=strict)
    if kind is ConstraintKind.REGEX:
        return compiler.compile_regex(source)
    if kind is ConstraintKind.CHOICE:
        choices: list[str] = json.loads(source)
        return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in choices))
    if kind is ConstraintKind.STRUCTURAL_TAG:
        return compiler.compile_structural_tag(source)
    return compiler.compile_grammar(source)


def tokenizer_info(tokenizer: Tokenizer) -> xgr.TokenizerInfo:
    """xgrammar's view of the vocabulary: each token's raw bytes, special tokens empty so no grammar admits
    them as text, and the tokenizer's end-of-turn ids as the grammar's stop tokens."""
    vocab = tokenizer.token_bytes()
    return xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=len(vocab),
                             stop_token_ids=sorted(tokenizer.eos_token_ids))
