"""Grammar compiles in child processes, so that one past its deadline is killed instead of holding a worker.

xgrammar cannot cancel a compile, and a thread cannot be stopped: a schema built to be slow kept both compile
threads busy for minutes while every tenant's structured output waited. Each child holds the vocabulary once,
compiles one constraint at a time and sends back the compiled grammar serialized; the parent kills a child that
has not answered by the deadline and starts a fresh one for the next compile.
"""

from __future__ import annotations

import json
import multiprocessing
import re
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import xgrammar as xgr

START_TIMEOUT_S = 120.0  # a child imports xgrammar and reads the vocabulary before its first compile
_ANY_OBJECT = '{"type": "object"}'
_SOURCE_LOCATION = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # xgrammar's "[12:00:00] file.cc:94: " prefix
_SPAWN = multiprocessing.get_context("spawn")  # a fork of a process running torch threads can deadlock


class CompileFailed(ValueError):
    """xgrammar refused the source; the message is its reason, without its source location."""


class CompileDeadline(TimeoutError):
    """The compile ran past its deadline and its child was killed."""


class CompileChild:
    """One child process; `compile` blocks the calling thread, and one thread uses a child at a time."""

    def __init__(self, tokenizer_json: str) -> None:
        self._conn, child_end = _SPAWN.Pipe()
        self._process: BaseProcess = _SPAWN.Process(target=_serve, args=(child_end, tokenizer_json), daemon=True,
                                                    name="tidegate-grammar")
        self._process.start()
        child_end.close()
        if not self._conn.poll(START_TIMEOUT_S):
            self.kill()
            raise RuntimeError("the grammar compiler process did not start")
        self._conn.recv()

    def compile(self, kind: str, source: str, deadline_s: float) -> str:
        """The compiled grammar as xgrammar's JSON; raises CompileFailed or CompileDeadline (child killed)."""
        self._conn.send((kind, source))
        if not self._conn.poll(deadline_s):
            self.kill()
            raise CompileDeadline(f"no answer within {deadline_s:g}s")
        ok, answer = self._conn.recv()
        if not ok:
            raise CompileFailed(answer)
        return str(answer)

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    def kill(self) -> None:
        self._process.kill()
        self._process.join(5)
        self._conn.close()


def compile_source(compiler: xgr.GrammarCompiler, kind: str, source: str) -> xgr.CompiledGrammar:
    """`kind` is a ConstraintKind's value."""
    if kind in ("json_schema", "json_object"):
        # Compact JSON: free whitespace lets a small model pad with newlines until max_tokens.
        # Strict mode (no properties beyond the schema's) for schemas; json_object allows any properties.
        return compiler.compile_json_schema(source or _ANY_OBJECT, any_whitespace=False,
                                            strict_mode=kind == "json_schema")
    if kind == "regex":
        return compiler.compile_regex(source)
    if kind == "choice":
        choices: list[str] = json.loads(source)
        return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in choices))
    if kind == "structural_tag":
        return compiler.compile_structural_tag(source)
    return compiler.compile_grammar(source)


def _serve(conn: Connection, tokenizer_json: str) -> None:
    import xgrammar as xgr  # in the child only: the parent loads it on its first constrained request

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.deserialize_json(tokenizer_json), max_threads=1,
                                   cache_enabled=False)
    conn.send("ready")
    while True:
        try:
            kind, source = conn.recv()
        except (EOFError, OSError):
            return  # the parent went away
        try:
            conn.send((True, compile_source(compiler, kind, source).serialize_json()))
        except Exception as exc:  # xgrammar raises RuntimeError and ValueError subclasses with the reason
            lines = str(exc).strip().splitlines()
            conn.send((False, _SOURCE_LOCATION.sub("", lines[0]) if lines else type(exc).__name__))
