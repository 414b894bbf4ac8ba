"""Structured output at the engine level: the step's mask, compiling and its cache, constrained generation."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from typing import Any

import jsonschema
import pytest
import torch

from backend.engine.records import Delta, GenerateRequest
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Sequence
from backend.engine.structured_output import (
    MAX_PENDING,
    MAX_PENDING_PER_TENANT,
    CompilerBusy,
    CompileTimeout,
    Constraint,
    ConstraintError,
    ConstraintKind,
    GrammarCompiler,
    TenantCompilesBusy,
)
from backend.executor.sample.token_mask import apply_token_constraints
from backend.loading.loader import LoadedModel

YES_NO = Constraint(ConstraintKind.CHOICE, json.dumps(["yes", "no"]), "structured_outputs.choice")
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def grammars(loaded_model: LoadedModel) -> Any:
    compiler = GrammarCompiler(loaded_model.tokenizer)
    yield compiler
    compiler.close()


def seq_with(constraint: Any = None) -> Sequence:
    seq = Sequence("r", [1, 2, 3], SamplingParams(temperature=0.0))
    seq.constraint = constraint
    return seq


def test_mask_step_leaves_only_tokens_the_grammar_allows(loaded_model: LoadedModel, grammars: Any) -> None:
    tok = loaded_model.tokenizer
    logits = torch.randn(2, tok.vocab_size, generator=torch.Generator().manual_seed(0))
    free_row = logits[1].clone()
    apply_token_constraints(logits, [seq_with(grammars.state_for(YES_NO)), seq_with()], [0])
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert sorted(tok.decode([t]) for t in allowed) == ["n", "no", "y", "ye", "yes"]
    assert torch.equal(logits[1], free_row)  # an unconstrained row in the same batch is untouched


def test_each_constrained_row_gets_its_own_grammar(loaded_model: LoadedModel, grammars: Any) -> None:
    tok = loaded_model.tokenizer
    digits = grammars.state_for(Constraint(ConstraintKind.REGEX, "[0-9]{3}", "structured_outputs.regex"))
    logits = torch.zeros(2, tok.vocab_size)
    apply_token_constraints(logits, [seq_with(digits), seq_with(grammars.state_for(YES_NO))], [0])
    first = {tok.decode([t]) for t in torch.isfinite(logits[0]).nonzero().flatten().tolist()}
    assert first and all(text.isdigit() and len(text) <= 3 for text in first)
    assert "yes" in {tok.decode([t]) for t in torch.isfinite(logits[1]).nonzero().flatten().tolist()}


def test_a_grammar_that_allows_nothing_leaves_its_row_only_eos(loaded_model: LoadedModel, grammars: Any) -> None:
    never_ends = grammars.state_for(Constraint(ConstraintKind.GRAMMAR, "root ::= root", "structured_outputs.grammar"))
    logits = torch.zeros(1, loaded_model.tokenizer.vocab_size)
    apply_token_constraints(logits, [seq_with(never_ends)], [0, 2])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0, 2]


def test_a_forked_grammar_state_advances_independently(loaded_model: LoadedModel, grammars: Any) -> None:
    tok = loaded_model.tokenizer
    original = grammars.state_for(YES_NO)
    fork = original.fork()
    assert original.accept(tok.encode("yes", add_special_tokens=False)[0])
    assert fork.accept(tok.encode("no", add_special_tokens=False)[0])


def test_a_schema_is_compiled_once_and_cached(grammars: Any) -> None:
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(PERSON), "response_format")
    assert grammars.compiled(constraint) is grammars.compiled(constraint)


def test_a_schema_that_cannot_compile_names_its_field(grammars: Any) -> None:
    bad = Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "bogus"}', "response_format.json_schema.schema")
    with pytest.raises(ConstraintError) as caught:
        grammars.state_for(bad)
    assert caught.value.field == "response_format.json_schema.schema"
    assert "bogus" in str(caught.value)


def slow_schema(properties: int, seed: int = 0) -> dict[str, Any]:
    """A schema that is small as text but slow to compile: each property's pattern becomes its own automaton
    (120 properties: 13 kB, about 18 s on one core of the CI machine)."""
    props = {f"p{seed}_{k}": {"type": "string", "pattern": f"^[a-z]{{{k % 7 + 1},{k % 11 + 20}}}[0-9]{{2,9}}$"}
             for k in range(properties)}
    return {"type": "object", "properties": props, "required": list(props)}


def test_a_compile_past_its_deadline_is_killed_and_refused(loaded_model: LoadedModel) -> None:
    compiler = GrammarCompiler(loaded_model.tokenizer, timeout=1.0)
    try:
        compiler.state_for(YES_NO)  # starts the child process, whose start is not part of any deadline
        started = time.monotonic()
        with pytest.raises(CompileTimeout) as refused:
            compiler.state_for(Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(slow_schema(120)), "response_format"))
        assert time.monotonic() - started < 5.0  # the deadline, not the 18 s the compile would take
        assert "too complex to compile within 1s" in str(refused.value)
        assert compiler._idle == []  # its child was killed, not left compiling
        assert compiler.state_for(Constraint(ConstraintKind.REGEX, "[0-9]{3}", "guided_regex"))  # a fresh child
    finally:
        compiler.close()


def test_compiles_are_capped_per_tenant_and_in_all(loaded_model: LoadedModel) -> None:
    compiler = GrammarCompiler(loaded_model.tokenizer)
    stuck = threading.Event()
    real_compile = compiler._compile
    compiler._compile = lambda c, t: stuck.wait() and real_compile(c, t)  # type: ignore[method-assign]
    tenants = ["tenant-a"] * MAX_PENDING_PER_TENANT + [f"tenant-{i}" for i in range(MAX_PENDING - MAX_PENDING_PER_TENANT)]
    waiting = [threading.Thread(target=compiler.state_for, args=(
        Constraint(ConstraintKind.REGEX, f"[a-z]{{{i + 1}}}", "guided_regex"), tenant))
        for i, tenant in enumerate(tenants)]
    try:
        for thread in waiting:
            thread.start()
        deadline = time.monotonic() + 30
        while len(compiler._pending) < MAX_PENDING:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(TenantCompilesBusy):  # tenant-a has its share pending
            compiler.state_for(Constraint(ConstraintKind.REGEX, "y", "guided_regex"), "tenant-a")
        with pytest.raises(CompilerBusy):  # and nobody gets beyond the bound in all
            compiler.state_for(Constraint(ConstraintKind.REGEX, "x", "guided_regex"), "tenant-new")
    finally:
        stuck.set()
        for thread in waiting:
            thread.join(60)
        compiler.close()


def test_a_tenant_runs_one_compile_at_a_time_and_leaves_the_other_process(loaded_model: LoadedModel) -> None:
    compiler = GrammarCompiler(loaded_model.tokenizer)
    release = threading.Event()
    running: list[str] = []
    real_compile_now = compiler._compile_now

    def held(constraint: Constraint) -> Any:
        running.append(constraint.source)
        if constraint.source.startswith("a"):
            release.wait()
        return real_compile_now(constraint)

    compiler._compile_now = held  # type: ignore[method-assign]
    floods = [threading.Thread(target=compiler.state_for, args=(
        Constraint(ConstraintKind.REGEX, f"a{i}", "guided_regex"), "tenant-a")) for i in range(3)]
    try:
        for thread in floods:
            thread.start()
        deadline = time.monotonic() + 60
        while not running:  # one of tenant-a's compiles holds a process
            assert time.monotonic() < deadline
            time.sleep(0.01)
        compiler.state_for(Constraint(ConstraintKind.REGEX, "b", "guided_regex"), "tenant-b")  # not held up
        assert sum(source.startswith("a") for source in running) == 1  # tenant-a's others wait their turn
    finally:
        release.set()
        for thread in floods:
            thread.join(60)
        compiler.close()
    assert sorted(running) == ["a0", "a1", "a2", "b"]


def test_the_compiled_grammar_cache_is_per_tenant(loaded_model: LoadedModel) -> None:
    compiler = GrammarCompiler(loaded_model.tokenizer)
    compiles: list[Constraint] = []
    real_compile = compiler._compile
    compiler._compile = lambda c, t: compiles.append(c) or real_compile(c, t)  # type: ignore[method-assign]
    person = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(PERSON), "response_format")
    try:
        for tenant in ("salt-a", "salt-a", "salt-b", ""):
            compiler.state_for(person, tenant)
    finally:
        compiler.close()
    assert len(compiles) == 3  # tenant B's first use compiles anew: how fast it answers tells nothing of A


def test_constrained_generation_follows_the_schema_and_stops(make_engine: Any) -> None:
    engine = make_engine()
    engine.start()
    tok = engine.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Describe a person as JSON."}]))
    constraint = engine.grammars.state_for(
        Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(PERSON), "response_format"))
    request = GenerateRequest("s1", prompt, SamplingParams(max_tokens=48, temperature=0.0), constraint=constraint)

    async def run() -> list[Delta]:
        return [d async for d in engine.generate(request)]

    deltas = asyncio.run(run())
    assert deltas[-1].finish_reason == "stop"
    jsonschema.validate(json.loads("".join(d.text for d in deltas)), PERSON)


def test_serving_without_constraints_never_imports_xgrammar() -> None:
    # xgrammar with the transformers it imports holds ~50 MiB: only a constrained request may load it
    probe = "import sys, backend.server.app; print('xgrammar' in sys.modules, 'transformers' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]
