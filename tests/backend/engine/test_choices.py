"""n choices: the prompt is computed once and shared, each choice samples with its own derived seed, the
request ends when every choice has, and every KV block comes back."""

from __future__ import annotations

import asyncio
from typing import Any

from backend.engine.core import Delta, Engine, GenerateRequest
from backend.engine.sampling_params import SamplingParams

SAMPLED = SamplingParams(max_tokens=6, temperature=1.0, seed=7, ignore_eos=True)


def by_choice(deltas: list[Delta]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in deltas:
        out.setdefault(d.index, []).extend(d.token_ids)
    return out


async def run(engine: Engine, request: GenerateRequest) -> list[Delta]:
    return [d async for d in engine.generate(request)]


def test_n_choices_share_the_prompt_are_reproducible_and_free_every_block(make_engine: Any) -> None:
    engine = make_engine()
    engine.start()
    prompt = engine.tokenizer.encode("Once upon a time, in a small village by the sea, there lived")

    async def scenario() -> tuple[list[Delta], list[Delta], list[Delta]]:
        four = GenerateRequest("four", prompt, SAMPLED, n=4)
        again = GenerateRequest("again", prompt, SAMPLED, n=4)
        one = GenerateRequest("one", prompt, SAMPLED)
        return await asyncio.gather(run(engine, four), run(engine, again), run(engine, one))

    four, again, one = asyncio.run(scenario())
    choices = by_choice(four)
    assert sorted(choices) == [0, 1, 2, 3] and all(len(t) == 6 for t in choices.values())
    assert len({tuple(t) for t in choices.values()}) > 1  # each choice draws with its own seed
    assert by_choice(again) == choices  # ... derived from the request's, so the request is reproducible
    assert choices[0] == by_choice(one)[0]  # choice 0 keeps the request's seed
    finals = [d for d in four if d.finish_reason is not None]
    assert len(finals) == 4 and all(d.prompt_tokens == len(prompt) for d in finals)
    stats = engine.stats()
    assert stats.kv_blocks_free == stats.kv_blocks_total and stats.num_running == stats.num_waiting == 0
    engine.pool.check_invariants()


def test_aborting_an_n_request_ends_every_choice(make_engine: Any) -> None:
    engine = make_engine()
    engine.start()
    prompt = engine.tokenizer.encode("Count slowly:")

    async def scenario() -> list[Delta]:
        deltas = []
        async for d in engine.generate(GenerateRequest("gone", prompt, SAMPLED, n=3)):
            deltas.append(d)
            engine.abort("gone")
        return deltas

    deltas = asyncio.run(scenario())
    assert sorted(d.index for d in deltas if d.finish_reason == "abort") == [0, 1, 2]
    stats = engine.stats()
    assert stats.kv_blocks_free == stats.kv_blocks_total
    engine.pool.check_invariants()
