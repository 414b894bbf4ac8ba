"""Engine: greedy tokens equal transformers' alone, in a batch, under chunking, prefix hits and preemption;
bad requests refused; aborts and disconnects free blocks; queue bounds; seeded sampling; stop handling."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from backend.engine.core import Delta, Engine, GenerateRequest
from backend.engine.errors import EngineOverloaded, InvalidGenerateRequest, QueueTimeout
from backend.engine.sampling_params import SamplingParams
from tests.backend.engine_fixtures import REFERENCE_TOKENS

# The first test to ask for the transformers reference builds it: minutes when the CPU is shared.
pytestmark = pytest.mark.timeout(900)

GREEDY = SamplingParams(max_tokens=REFERENCE_TOKENS, min_tokens=REFERENCE_TOKENS, temperature=0.0)


def assert_all_blocks_free(engine: Engine) -> None:
    stats = engine.stats()
    assert stats.num_running == 0 and stats.num_waiting == 0
    assert stats.kv_blocks_free == stats.kv_blocks_total
    engine.pool.check_invariants()


async def collect(engine: Engine, request: GenerateRequest) -> list[Delta]:
    return [d async for d in engine.generate(request)]


def test_greedy_batch_matches_transformers_raw_and_chat(
    make_engine: Any, prompt_ids: list[list[int]], reference_tokens: list[list[int]]
) -> None:
    engine = make_engine(kv_cache_memory=64 * 1024 * 1024)
    results = engine.generate_offline(prompt_ids, GREEDY)
    for i, (result, expected) in enumerate(zip(results, reference_tokens, strict=True)):
        assert result.token_ids == expected, f"prompt {i} diverged from transformers"
        assert result.finish_reason == "length"
        assert result.text == engine.tokenizer.decode(expected)
    assert_all_blocks_free(engine)


def test_prompt_alone_matches_transformers(
    make_engine: Any, prompt_ids: list[list[int]], reference_tokens: list[list[int]]
) -> None:
    engine = make_engine()
    for index in (0, 8):  # one raw prompt, one through the chat template
        [result] = engine.generate_offline([prompt_ids[index]], GREEDY)
        assert result.token_ids == reference_tokens[index]


async def test_batch_of_32_with_staggered_arrivals_chunking_prefix_hits_and_preemption(
    make_engine: Any, loaded_model: Any, prompt_ids: list[list[int]], reference_tokens: list[list[int]]
) -> None:
    # 40 blocks of 16 tokens cannot hold 32 requests of ~100 tokens: the scheduler must preempt.
    engine = make_engine(kv_cache_tokens=40 * 16, max_num_batched_tokens=64, max_num_seqs=32, queue_timeout=600.0)
    assert engine.pool.num_blocks == 40
    engine.start()
    fillers = [
        (prompt_ids[8 + i % 8] + prompt_ids[i % 8], SamplingParams(max_tokens=8 + 4 * i, temperature=0.0))
        for i in range(16)
    ]
    requests = [(ids, GREEDY) for ids in prompt_ids] + fillers
    tasks: list[asyncio.Task[list[Delta]]] = []
    for wave in range(4):  # each wave arrives once the previous one is producing tokens
        for i in range(wave * 8, wave * 8 + 8):
            ids, params = requests[i]
            tasks.append(asyncio.create_task(collect(engine, GenerateRequest(f"r{i}", ids, params))))
        for _ in range(2000):
            if engine.stats().steps >= 3 * (wave + 1) or all(t.done() for t in tasks):
                break
            await asyncio.sleep(0.01)
    results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=240)
    for i, expected in enumerate(reference_tokens):
        assert [t for d in results[i] for t in d.token_ids] == expected, f"prompt {i} diverged in the batch"
    for (_, params), deltas in zip(fillers, results[16:], strict=True):
        assert deltas[-1].completion_tokens <= params.max_tokens
    stats = engine.stats()
    assert stats.num_preemptions > 0
    assert stats.prefix_cache_hits > 0
    assert any(d[-1].cached_tokens > 0 for d in results)
    assert_all_blocks_free(engine)


async def test_bad_requests_are_refused_before_touching_the_cache(make_engine: Any) -> None:
    engine = make_engine()
    engine.start()
    too_long = [1] * engine.max_model_len
    broken = SamplingParams(max_tokens=4)
    broken.max_tokens = -1  # mutated after validation: the engine validates again
    cases = [
        GenerateRequest("empty", [], SamplingParams()),
        GenerateRequest("long", too_long, SamplingParams(max_tokens=1)),
        GenerateRequest("vocab", [engine.model_config.vocab_size + 5], SamplingParams()),
        GenerateRequest("negative-id", [-1, 2], SamplingParams()),
        GenerateRequest("params", [1, 2, 3], broken),
    ]
    for request in cases:
        with pytest.raises(InvalidGenerateRequest):
            await collect(engine, request)
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    stats = engine.stats()
    assert stats.prefix_cache_queries == 0 and stats.steps == 0
    assert_all_blocks_free(engine)


def test_seeded_sampling_is_reproducible_across_batch_compositions(
    make_engine: Any, prompt_ids: list[list[int]]
) -> None:
    engine = make_engine()
    seeded = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, top_k=40, seed=1234)
    [alone] = engine.generate_offline([prompt_ids[2]], seeded)
    others = [dataclasses.replace(seeded, seed=s) for s in (1, 2, 3)]
    batch = engine.generate_offline(
        [prompt_ids[0], prompt_ids[2], prompt_ids[9], prompt_ids[2]], [others[0], seeded, others[1], others[2]]
    )
    assert batch[1].token_ids == alone.token_ids
    assert batch[3].token_ids != alone.token_ids, "a different seed should draw differently"


async def test_abort_of_waiting_and_running_requests_frees_their_blocks(
    make_engine: Any, prompt_ids: list[list[int]]
) -> None:
    engine = make_engine(max_num_seqs=1)
    engine.start()
    long = SamplingParams(max_tokens=200, ignore_eos=True, temperature=0.0)
    running = engine.generate(GenerateRequest("running", prompt_ids[8], long))
    first = await running.__anext__()
    assert first.finish_reason is None
    waiting = asyncio.create_task(collect(engine, GenerateRequest("waiting", prompt_ids[9], long)))
    while engine.stats().num_waiting == 0:
        await asyncio.sleep(0.005)
    engine.abort("waiting")
    aborted = await asyncio.wait_for(waiting, timeout=10)
    assert aborted[-1].finish_reason == "abort" and aborted[-1].completion_tokens == 0
    engine.abort("running")
    rest = [d async for d in running]
    assert rest[-1].finish_reason == "abort"
    assert rest[-1].completion_tokens < 200
    assert_all_blocks_free(engine)


async def test_closing_the_stream_aborts_the_request(make_engine: Any, prompt_ids: list[list[int]]) -> None:
    engine = make_engine()
    engine.start()
    stream = engine.generate(GenerateRequest("gone", prompt_ids[0], SamplingParams(max_tokens=200, ignore_eos=True)))
    await stream.__anext__()
    await stream.aclose()  # what a client disconnect does to the server's iterator
    for _ in range(200):
        if engine.stats().num_running == 0:
            break
        await asyncio.sleep(0.01)
    assert_all_blocks_free(engine)


async def test_full_queue_overloads_and_a_stuck_request_times_out(
    make_engine: Any, prompt_ids: list[list[int]]
) -> None:
    engine = make_engine(max_num_seqs=1, max_waiting=1, queue_timeout=0.5)
    engine.start()
    long = SamplingParams(max_tokens=300, ignore_eos=True)
    running = engine.generate(GenerateRequest("running", prompt_ids[8], long))
    await running.__anext__()
    stuck = asyncio.create_task(collect(engine, GenerateRequest("stuck", prompt_ids[1], long)))
    while engine.stats().num_waiting == 0:
        await asyncio.sleep(0.005)
    with pytest.raises(EngineOverloaded) as overloaded:
        await collect(engine, GenerateRequest("third", prompt_ids[2], long))
    assert overloaded.value.retry_after > 0
    with pytest.raises(QueueTimeout):
        await asyncio.wait_for(stuck, timeout=20)
    await running.aclose()
    for _ in range(200):
        if engine.stats().num_running == 0:
            break
        await asyncio.sleep(0.01)
    assert_all_blocks_free(engine)


def test_stop_string_is_trimmed_and_ends_the_request(
    make_engine: Any, prompt_ids: list[list[int]], reference_tokens: list[list[int]]
) -> None:
    engine = make_engine()
    full = engine.tokenizer.decode(reference_tokens[0])
    stop = full[len(full) // 2 : len(full) // 2 + 4]  # an arbitrary span, likely across tokens
    [result] = engine.generate_offline(
        [prompt_ids[0]], SamplingParams(max_tokens=REFERENCE_TOKENS, temperature=0.0, stop=[stop])
    )
    assert result.finish_reason == "stop"
    assert result.text == full[: full.index(stop)]
    stop_id = reference_tokens[0][3]
    [by_id] = engine.generate_offline(
        [prompt_ids[0]], SamplingParams(max_tokens=REFERENCE_TOKENS, temperature=0.0, stop_token_ids=[stop_id])
    )
    assert by_id.finish_reason == "stop"
    assert by_id.token_ids == reference_tokens[0][: reference_tokens[0].index(stop_id) + 1]
