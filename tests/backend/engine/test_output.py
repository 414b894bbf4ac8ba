"""Output processing: stop strings across token boundaries, finish reasons, and the engine applying them
outside its lock with one final delta per request."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from backend.engine import output
from backend.engine.core import Engine, GenerateRequest
from backend.engine.output import TextOutput, finish_reason
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import FinishReason, Sequence

pytestmark = pytest.mark.timeout(600)

EOS = 2


def make_seq(params: SamplingParams, generated: int = 0) -> Sequence:
    seq = Sequence("r", [5, 6, 7], params)
    seq.token_ids += [9] * generated
    return seq


class CharDetokenizer:
    """Token id n is the character chr(n): enough to drive TextOutput through real pushes."""

    def push(self, token_id: int) -> str:
        return chr(token_id)

    def flush(self) -> str:
        return ""


def feed(output: TextOutput, text: str) -> tuple[str, bool]:
    emitted = ""
    for ch in text:
        piece, stopped = output.push(ord(ch), True)
        emitted += piece
        if stopped:
            return emitted, True
    return emitted + output.flush(), False


def test_stop_string_spanning_tokens_is_trimmed_and_never_leaks() -> None:
    output = TextOutput(CharDetokenizer(), ["END", "halt"])
    assert output.push(ord("h"), True) == ("", False)  # held back: it could begin "halt"
    assert output.push(ord("a"), True) == ("", False)
    output = TextOutput(CharDetokenizer(), ["END", "halt"])
    assert feed(output, "hello wENorld, ENDING") == ("hello wENorld, ", True)


def test_earliest_stop_string_wins() -> None:
    output = TextOutput(CharDetokenizer(), ["xyz", "yz!"])
    assert feed(output, "abxyz!") == ("ab", True)


def test_without_stop_strings_text_flows_through_immediately() -> None:
    output = TextOutput(CharDetokenizer(), [])
    assert output.push(ord("q"), True) == ("q", False)


def test_stop_strings_are_ignored_until_checking_is_allowed() -> None:
    output = TextOutput(CharDetokenizer(), ["ab"])
    assert output.push(ord("a"), False) == ("", False)
    text, stopped = output.push(ord("b"), False)
    assert not stopped
    assert text + output.push(ord("c"), True)[0] + output.flush() == "abc"


def test_finish_reason_for_eos_stop_ids_length_and_ignore_eos() -> None:
    eos = frozenset({EOS})
    assert finish_reason(make_seq(SamplingParams(max_tokens=5), 1), EOS, eos) is FinishReason.STOP
    assert finish_reason(make_seq(SamplingParams(max_tokens=5, ignore_eos=True), 1), EOS, eos) is None
    assert finish_reason(make_seq(SamplingParams(max_tokens=5, stop_token_ids=[8]), 1), 8, eos) is FinishReason.STOP
    assert finish_reason(make_seq(SamplingParams(max_tokens=5), 5), 9, eos) is FinishReason.LENGTH
    assert finish_reason(make_seq(SamplingParams(max_tokens=5, min_tokens=3), 2), EOS, eos) is None


def greedy_pieces(engine: Engine, prompt: list[int], n: int) -> list[str]:
    """The text of each of the first n greedy tokens, so a test can place a stop string across two of them."""
    [result] = engine.generate_offline([prompt], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    return [engine.tokenizer.decode(result.token_ids[: i + 1]) for i in range(n)]


def spanning_stop(pieces: list[str]) -> tuple[str, int]:
    """A stop string made of the end of one token's text and the start of the next's, and that next token's
    index."""
    for i in range(1, len(pieces) - 1):
        before, after = pieces[i - 1], pieces[i]
        if len(before) < 2 or len(after) - len(before) < 2 or not after.startswith(before):
            continue
        stop = after[len(before) - 2 : len(before) + 2]
        if stop.isprintable() and after.find(stop) == len(before) - 2:  # first seen with the second token
            return stop, i
    raise AssertionError(f"no two printable tokens to span in {pieces!r}")


async def test_stop_string_spanning_two_tokens_finishes_once_and_frees_blocks(
    make_engine: Any, prompt_ids: list[list[int]]
) -> None:
    engine = make_engine()
    pieces = greedy_pieces(engine, prompt_ids[0], 16)
    stop, second = spanning_stop(pieces)
    engine.start()
    request = GenerateRequest("span", prompt_ids[0], SamplingParams(max_tokens=16, temperature=0.0, stop=[stop]))
    deltas = [d async for d in engine.generate(request)]
    assert [d.finish_reason for d in deltas].count("stop") == 1 and deltas[-1].finish_reason == "stop"
    assert "".join(d.text for d in deltas) == pieces[-1][: pieces[-1].index(stop)]
    assert deltas[-1].completion_tokens == second + 1  # the token that completed the stop string was the last
    stats = engine.stats()
    assert stats.num_running == 0 and stats.kv_blocks_free == stats.kv_blocks_total


def test_stop_string_on_the_last_allowed_token_reports_stop(
    make_engine: Any, prompt_ids: list[list[int]]
) -> None:
    engine = make_engine()
    pieces = greedy_pieces(engine, prompt_ids[0], 16)
    stop, second = spanning_stop(pieces)
    params = SamplingParams(max_tokens=second + 1, temperature=0.0, stop=[stop])
    [result] = engine.generate_offline([prompt_ids[0]], params)
    assert result.finish_reason == "stop"
    assert result.text == pieces[-1][: pieces[-1].index(stop)]


def test_detokenizing_runs_outside_the_engine_lock(
    make_engine: Any, prompt_ids: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine()
    answered: list[bool] = []

    def checked_step_text(seq: Sequence, token_id: int, ahead: int = 0) -> tuple[str, bool]:
        # stats() takes the engine lock: from another thread it answers only if the step does not hold it.
        probe = threading.Thread(target=engine.stats)
        probe.start()
        probe.join(timeout=30)
        answered.append(not probe.is_alive())
        return real_step_text(seq, token_id, ahead)

    real_step_text = output.step_text
    monkeypatch.setattr("backend.engine.output.step_text", checked_step_text)
    [result] = engine.generate_offline([prompt_ids[0]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert answered == [True] * 4 and result.finish_reason == "length"


async def test_an_abort_ends_the_stream_after_every_token_it_counts(
    make_engine: Any, prompt_ids: list[list[int]]
) -> None:
    engine = make_engine()
    engine.start()
    request = GenerateRequest("cut", prompt_ids[0], SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    deltas = []
    async for delta in engine.generate(request):
        deltas.append(delta)
        if len(deltas) == 3:
            engine.abort("cut")
    assert [d.finish_reason for d in deltas].count("abort") == 1 and deltas[-1].finish_reason == "abort"
    assert deltas[-1].completion_tokens == sum(len(d.token_ids) for d in deltas) < 64
    stats = engine.stats()
    assert stats.num_running == 0 and stats.kv_blocks_free == stats.kv_blocks_total
