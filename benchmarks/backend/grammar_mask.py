"""What a grammar constraint adds to one decode step: compile once, then per step fill the constrained rows'
bitmask and apply it to the logits; xgrammar (what the backend uses) against llguidance.

Replays the tokens of one valid JSON document through B matchers of the same schema (B = 1 and 32) over the
default model's vocabulary, and reports the mean per step of the mask fill, of the apply
(`backend.executor.sample.token_mask.apply_token_constraints`) and of the accept, in CPU time on one torch thread.

    .venv/bin/python -m benchmarks.backend.grammar_mask [--steps-repeat 5]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch

from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Sequence
from backend.engine.structured_output import Constraint, ConstraintKind, GrammarCompiler
from backend.executor.sample.token_mask import apply_token_constraints
from backend.loading.model_cache import pull
from backend.loading.tokenizer import Tokenizer

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
DOCUMENT = '{"name": "Alice Smith", "age": 42, "tags": ["a", "bb", "ccc"]}'


def load_tokenizer() -> Tokenizer:
    from gguf import GGUFReader

    from backend.loading.gguf.weights import read_metadata

    return Tokenizer.from_gguf_metadata(read_metadata(GGUFReader(pull("smollm2", quiet=True))), 8192)


def cpu_ms(fn: Callable[[], Any]) -> float:
    start = time.process_time()
    fn()
    return (time.process_time() - start) * 1e3


def xgrammar_step(tok: Tokenizer, batch: int, ids: list[int]) -> dict[str, float]:
    compiler = GrammarCompiler(tok)
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA), "bench")
    compile_ms = cpu_ms(lambda: compiler.compiled(constraint))
    seqs = []
    for _ in range(batch):
        seq = Sequence("b", [1], SamplingParams())
        seq.constraint = compiler.state_for(constraint)
        seqs.append(seq)
    logits = torch.randn(batch, tok.vocab_size)
    bitmask = torch.full((batch, (tok.vocab_size + 31) // 32), -1, dtype=torch.int32)
    fill_ms = step_ms = accept_ms = 0.0
    for token in ids:
        fill_ms += cpu_ms(lambda: [s.constraint.fill_next_token_bitmask(bitmask, i)  # type: ignore[union-attr]
                                   for i, s in enumerate(seqs)])
        step_ms += cpu_ms(lambda: apply_token_constraints(logits, seqs, sorted(tok.eos_token_ids)))  # fill and apply, as the sampler runs it
        accept_ms += cpu_ms(lambda t=token: [s.constraint.accept(t) for s in seqs])  # type: ignore[union-attr,misc]
    compiler.close()
    return {"compile_ms": compile_ms, "fill_ms": fill_ms / len(ids), "mask_step_ms": step_ms / len(ids),
            "accept_ms": accept_ms / len(ids)}


def llguidance_step(tok: Tokenizer, batch: int, ids: list[int]) -> dict[str, float]:
    import llguidance
    import llguidance.torch as llgt

    lltok = llguidance.LLTokenizer(tok._backend.to_str(), n_vocab=tok.vocab_size, eos_token=sorted(tok.eos_token_ids))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    compile_ms = cpu_ms(lambda: llguidance.LLMatcher(lltok, grammar))
    matchers = [llguidance.LLMatcher(lltok, grammar) for _ in range(batch)]
    bitmask = llgt.allocate_token_bitmask(batch, tok.vocab_size)
    fill_ms = accept_ms = 0.0
    for token in ids:
        # per row, as the backend's step fills them (the parallel executor would add threads to a busy CPU)
        fill_ms += cpu_ms(lambda: fill_each(matchers, bitmask, llgt.fill_next_token_bitmask))
        accept_ms += cpu_ms(lambda t=token: [m.consume_token(t) for m in matchers])  # type: ignore[misc]
    return {"compile_ms": compile_ms, "fill_ms": fill_ms / len(ids), "accept_ms": accept_ms / len(ids)}


def fill_each(matchers: list[Any], bitmask: torch.Tensor, fill: Callable[..., None]) -> None:
    for row, matcher in enumerate(matchers):
        fill(matcher, bitmask, row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps-repeat", type=int, default=5, help="replay the document this many times")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tok = load_tokenizer()
    ids = tok.encode(DOCUMENT, add_special_tokens=False)
    results = {}
    for batch in (1, 32):
        xg = [xgrammar_step(tok, batch, ids) for _ in range(args.steps_repeat)]
        ll = [llguidance_step(tok, batch, ids) for _ in range(args.steps_repeat)]
        results[f"batch_{batch}"] = {"xgrammar": median_of(xg), "llguidance": median_of(ll)}
    print(json.dumps({"vocab": tok.vocab_size, "steps": len(ids), **results}, indent=2))


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(sorted(r[key] for r in runs)[len(runs) // 2], 3) for key in runs[0]}


if __name__ == "__main__":
    main()
