"""Structured output: constraints compiled to token grammars (xgrammar), cached, and matched per sequence.

xgrammar over llguidance because its per-step mask fill is cheaper on this vocabulary (docs/benchmarks.md,
`benchmarks.backend.grammar_mask`); both share the packed int32 bitmask that `backend.executor.sample.token_mask` applies.
Compiling runs in child processes killed at a hard deadline (grammar_worker.py), never on the step loop, and
each constraint is compiled once per tenant: a bounded LRU keyed by the tenant and a digest of kind and source.
xgrammar (and the transformers it imports, ~50 MiB resident together) is imported by the first constrained
request, not with this module: a server whose requests never constrain their output never holds it.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter, OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from backend.engine.grammar_worker import CompileChild, CompileDeadline, CompileFailed

if TYPE_CHECKING:
    import torch
    import xgrammar as xgr

    from backend.loading.tokenizer import Tokenizer

COMPILE_TIMEOUT_S = 10.0
CACHE_SIZE = 256
COMPILE_WORKERS = 2
MAX_PENDING = 16  # distinct constraints compiling or queued; beyond it new ones are refused at once
MAX_PENDING_PER_TENANT = 4  # a tenant's compiles queued or running; beyond it its new ones are refused
# a tenant runs one compile at a time: with two worker processes, one is always left to the other tenants


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
    """Compiling took longer than the deadline; the compile was stopped (a 400: the constraint is the problem)."""


class CompilerBusy(Exception):
    """Too many distinct constraints are compiling already; the caller should retry later."""


class TenantCompilesBusy(CompilerBusy):
    """This tenant's own compiles fill its share; it should retry once they are done (a 429)."""


class GrammarState:
    """One sequence's position in its grammar: fills its row of the step's bitmask and accepts sampled tokens."""

    __slots__ = ("_matcher",)

    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        import xgrammar as xgr

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
    """Compiles constraints for one tokenizer, at most once per tenant and digest, each within a hard deadline.

    The cache is per tenant (the request's cache salt; anonymous callers share one): a schema another tenant
    compiled answers as slowly for you as a new one, so its speed tells nothing. A tenant runs one compile at a
    time and has at most MAX_PENDING_PER_TENANT pending, so its slow schemas leave the other worker process to
    everyone else."""

    def __init__(self, tokenizer: Tokenizer, *, cache_size: int = CACHE_SIZE,
                 timeout: float = COMPILE_TIMEOUT_S) -> None:
        self._tokenizer = tokenizer
        self._info: xgr.TokenizerInfo | None = None  # built on first use: engines that never constrain skip it
        self._info_json = ""
        self._timeout = timeout
        self._cache_size = cache_size
        self._cache: OrderedDict[str, xgr.CompiledGrammar] = OrderedDict()
        self._pending: dict[str, Future[xgr.CompiledGrammar]] = {}
        self._per_tenant: Counter[str] = Counter()
        self._idle: list[CompileChild] = []  # child processes between compiles
        self._lock = threading.Lock()
        self._turn = threading.Condition()  # a compile runs once a process is free and its tenant runs no other
        self._running: set[str] = set()  # the tenants whose compile runs now
        # a thread per pending compile: waiting for its turn must not hold up other tenants' compiles
        self._pool = ThreadPoolExecutor(MAX_PENDING, thread_name_prefix="tidegate-grammar")

    def state_for(self, constraint: Constraint, tenant: str = "") -> GrammarState:
        """A fresh matcher for `constraint`; raises ConstraintError, CompileTimeout or CompilerBusy. Blocks for
        the compile (and the compiles queued ahead of it): call it off the event loop and off the step loop."""
        return GrammarState(self.compiled(constraint, tenant))

    def compiled(self, constraint: Constraint, tenant: str = "") -> xgr.CompiledGrammar:
        key = hashlib.sha256(f"{tenant}\0{constraint.digest}".encode()).hexdigest()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            future = self._pending.get(key)
            started = future is None
            if future is None and self._per_tenant[tenant] >= MAX_PENDING_PER_TENANT:
                raise TenantCompilesBusy(f"{self._per_tenant[tenant]} of your output constraints are compiling")
            if future is None and len(self._pending) >= MAX_PENDING:  # slow schemas must not queue up unbounded
                raise CompilerBusy(f"{len(self._pending)} output constraints are compiling")
            if future is None:  # one compile per tenant and digest, however many requests wait for it
                future = self._pool.submit(self._compile, constraint, tenant)
                self._pending[key] = future
                self._per_tenant[tenant] += 1
        if started:  # outside the lock: a compile already done runs its callback in this thread
            future.add_done_callback(lambda done: self._store(key, tenant, done))
        return future.result()  # bounded: each compile ahead of it in the queue ends by its own deadline

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            idle, self._idle = self._idle, []
        for child in idle:
            child.kill()

    def _compile(self, constraint: Constraint, tenant: str) -> xgr.CompiledGrammar:
        with self._turn:
            self._turn.wait_for(lambda: len(self._running) < COMPILE_WORKERS and tenant not in self._running)
            self._running.add(tenant)
        try:
            return self._compile_now(constraint)
        finally:
            with self._turn:
                self._running.discard(tenant)
                self._turn.notify_all()

    def _compile_now(self, constraint: Constraint) -> xgr.CompiledGrammar:
        with self._lock:
            if self._info is None:
                self._info = tokenizer_info(self._tokenizer)
                self._info_json = self._info.serialize_json()
            child = self._idle.pop() if self._idle else None
        if child is None or not child.alive:
            child = CompileChild(self._info_json)
        field = constraint.field
        try:
            compiled = child.compile(constraint.kind.value, constraint.source, self._timeout)
        except CompileDeadline:  # the child was killed: the next compile starts a fresh one
            raise CompileTimeout(f"`{field}` is too complex to compile within {self._timeout:g}s; simplify it "
                                 "(fewer properties, alternatives or nested bounds)", field) from None
        except CompileFailed as exc:
            raise ConstraintError(f"`{field}` cannot be compiled: {str(exc)[:300]}", field) from None
        finally:
            if child.alive:
                with self._lock:
                    self._idle.append(child)
        assert self._info is not None  # set before the first child was started
        import xgrammar as xgr

        return xgr.CompiledGrammar.deserialize_json(compiled, self._info)

    def _store(self, key: str, tenant: str, done: Future[xgr.CompiledGrammar]) -> None:
        with self._lock:
            self._pending.pop(key, None)
            self._per_tenant[tenant] -= 1
            if self._per_tenant[tenant] <= 0:
                del self._per_tenant[tenant]
            if done.cancelled() or done.exception() is not None:
                return
            self._cache[key] = done.result()
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)


def tokenizer_info(tokenizer: Tokenizer) -> xgr.TokenizerInfo:
    """xgrammar's view of the vocabulary: each token's raw bytes, special tokens empty so no grammar admits
    them as text, and the tokenizer's end-of-turn ids as the grammar's stop tokens."""
    import xgrammar as xgr

    vocab = tokenizer.token_bytes()
    return xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=len(vocab),
                             stop_token_ids=sorted(tokenizer.eos_token_ids))
