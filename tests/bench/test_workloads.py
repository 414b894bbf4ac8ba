"""Workloads: ranged lengths, shared prefixes, multi-turn conversations, JSONL datasets and their errors."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from bench.client import Target
from bench.realistic import CHAT_TURNS, PASSAGES, QUESTIONS, realistic_set
from bench.tokenizer import PromptTokenizer
from bench.workloads import GROUNDED_TASKS, GROUNDED_TEXT, Workload, WorkloadError, WorkloadSpec


def take(workload: Workload, n: int) -> list:
    return list(itertools.islice(workload.conversations(), n))


def test_fixed_lengths_are_exact(tokenizer: PromptTokenizer) -> None:
    for [spec] in take(Workload(WorkloadSpec(input_len=100, output_len=20), tokenizer), 10):
        assert isinstance(spec.prompt, str)
        assert tokenizer.count(spec.prompt) == spec.input_tokens == 100
        assert spec.output_len == 20


def test_range_ratio_spreads_lengths_within_bounds(tokenizer: PromptTokenizer) -> None:
    convs = take(Workload(WorkloadSpec(input_len=100, output_len=50, range_ratio=0.5), tokenizer, seed=3), 60)
    inputs = [c[0].input_tokens for c in convs]
    outputs = [c[0].output_len for c in convs]
    assert min(inputs) >= 50 and max(inputs) <= 150 and len(set(inputs)) > 10
    assert min(outputs) >= 25 and max(outputs) <= 75 and len(set(outputs)) > 10
    assert all(tokenizer.count(c[0].prompt) == c[0].input_tokens for c in convs[:10])


def test_shared_prefixes_repeat_exactly_and_keep_the_total_length(tokenizer: PromptTokenizer) -> None:
    spec = WorkloadSpec(input_len=80, output_len=8, shared_prefix_len=48, num_prefixes=3)
    convs = take(Workload(spec, tokenizer, seed=4), 30)
    prompts = [c[0].prompt for c in convs]
    prefixes = {" ".join(p.split()[:48]) for p in prompts}  # every pooled word is one token
    assert len(prefixes) == 3
    assert len(set(prompts)) == 30  # the suffixes differ
    assert all(tokenizer.count(p) == 80 for p in prompts)


def test_multi_turn_yields_conversations_of_that_many_turns(tokenizer: PromptTokenizer) -> None:
    [conv] = take(Workload(WorkloadSpec(input_len=16, output_len=4, turns=4), tokenizer), 1)
    assert len(conv) == 4
    assert len({spec.prompt for spec in conv}) == 4


def test_same_seed_gives_the_same_prompts(tokenizer: PromptTokenizer) -> None:
    spec = WorkloadSpec(input_len=32, output_len=4)
    assert take(Workload(spec, tokenizer, seed=9), 3) == take(Workload(spec, tokenizer, seed=9), 3)


def test_jsonl_dataset_reads_prompts_and_messages_and_cycles(tokenizer: PromptTokenizer, tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "hello there", "output_len": 5},
            {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    convs = take(Workload(WorkloadSpec(output_len=9, dataset=path), tokenizer), 5)
    assert [c[0].output_len for c in convs] == [5, 9, 5, 9, 5]
    assert convs[0][0].input_tokens == tokenizer.count("hello there")
    assert convs[1][0].prompt == rows[1]["messages"]


def test_dataset_runs_without_a_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "x"}\n')
    [[spec]] = take(Workload(WorkloadSpec(dataset=path), None), 1)
    assert spec.input_tokens == 0  # left to the server's usage


@pytest.mark.parametrize("line", [
    "not json", "[1, 2]", '{"text": "no prompt key"}', '{"prompt": ""}', '{"prompt": 5}',
    '{"messages": [{"role": "user"}]}', '{"messages": []}', '{"prompt": "x", "output_len": 0}',
    '{"prompt": "x", "output_len": "ten"}', '{"prompt": "x", "output_len": true}',
])
def test_malformed_dataset_lines_name_the_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(WorkloadError, match=r"bad\.jsonl:2"):
        Workload(WorkloadSpec(dataset=path), None)


def test_empty_or_missing_dataset_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n")
    for path in (tmp_path / "empty.jsonl", tmp_path / "absent.jsonl"):
        with pytest.raises(WorkloadError):
            Workload(WorkloadSpec(dataset=path), None)


@pytest.mark.parametrize("kwargs", [
    {"input_len": 0}, {"output_len": 0}, {"range_ratio": 1.0}, {"range_ratio": -0.1},
    {"shared_prefix_len": 256}, {"shared_prefix_len": 100, "range_ratio": 0.7}, {"num_prefixes": 0},
    {"turns": 0},
])
def test_workloads_that_cannot_be_built_are_refused(kwargs: dict) -> None:
    with pytest.raises(WorkloadError):
        WorkloadSpec(**kwargs)


def test_synthetic_prompts_need_a_tokenizer() -> None:
    with pytest.raises(WorkloadError):
        Workload(WorkloadSpec(), None)


def test_a_system_prompt_heads_every_turn_of_a_conversation(tokenizer: PromptTokenizer) -> None:
    spec = WorkloadSpec(input_len=16, output_len=4, turns=3, system_prompt_len=40, num_prefixes=2)
    conversations = take(Workload(spec, tokenizer, seed=5), 20)
    assert all(len({turn.system for turn in conv}) == 1 for conv in conversations)
    assert len({conv[0].system for conv in conversations}) == 2
    assert all(tokenizer.count(conv[0].system) == 40 and conv[0].input_tokens == 56 for conv in conversations)
    target = Target("http://127.0.0.1:1", "m", endpoint="/v1/chat/completions")
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    roles = [m["role"] for m in target.body(conversations[0][1], history)["messages"]]
    assert roles == ["system", "user", "assistant", "user"]


def test_grounded_prompts_quote_the_shipped_text_at_about_the_input_length(tokenizer: PromptTokenizer) -> None:
    text = " ".join(GROUNDED_TEXT.read_text(encoding="utf-8").split())
    convs = take(Workload(WorkloadSpec(input_len=256, output_len=64, grounded=True), tokenizer, seed=1), 12)
    for [spec] in convs:
        assert isinstance(spec.prompt, str) and spec.output_len == 64
        task, passage = spec.prompt.split("\n\n", 1)
        assert task in GROUNDED_TASKS and passage in f"{text} {text}"  # a passage may wrap to the start
        assert 200 <= spec.input_tokens == tokenizer.count(spec.prompt) <= 300
    assert len({c[0].prompt for c in convs}) > 6


def test_grounded_workload_refuses_options_it_cannot_honour() -> None:
    with pytest.raises(WorkloadError, match="grounded"):
        WorkloadSpec(grounded=True, turns=2)


def _shipped_text() -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in (CHAT_TURNS, QUESTIONS, PASSAGES))


def test_realistic_prompts_come_from_the_shipped_set_with_output_len_as_a_cap(tokenizer: PromptTokenizer) -> None:
    shipped = _shipped_text()
    convs = take(Workload(WorkloadSpec(output_len=200, realistic=True), tokenizer, seed=3), 200)
    for conversation in convs:
        for spec in conversation:
            assert isinstance(spec.prompt, str) and spec.natural and spec.output_len == 200
            # a chat turn or question verbatim, or a task over a paragraph of the shipped text
            assert json.dumps(spec.prompt)[1:-1] in shipped or spec.prompt.split("\n\n", 1)[1] in shipped
            assert spec.input_tokens == tokenizer.count(spec.prompt)
    assert any(len(c) > 1 for c in convs)  # the set's multi-turn chats stay conversations
    assert len({c[0].prompt for c in convs}) > 30
    assert len(realistic_set()) >= 100


def test_realistic_completions_body_is_a_transcript_capped_by_max_tokens_without_ignore_eos() -> None:
    spec = next(c[1] for c in (Workload(WorkloadSpec(output_len=64, realistic=True), None, seed=0).conversations())
                if len(c) > 1)
    target = Target("http://127.0.0.1:1", "m")  # ignore_eos on: a real prompt still leaves it out
    body = target.body(spec, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    assert "ignore_eos" not in body and body["max_tokens"] == 64
    assert f"User: hi\n\nAssistant: hello\n\nUser: {spec.prompt}" in body["prompt"]
    assert body["prompt"].endswith("\n\nAssistant:") and body["stop"] == ["\nUser:"]


def test_realistic_chat_body_sends_the_conversation_as_messages() -> None:
    conversation = next(c for c in Workload(WorkloadSpec(output_len=64, realistic=True), None, seed=0)
                        .conversations() if c[0].system)
    target = Target("http://127.0.0.1:1", "m", endpoint="/v1/chat/completions")
    history = [{"role": "user", "content": conversation[0].prompt}, {"role": "assistant", "content": "ok"}]
    body = target.body(conversation[-1], history if len(conversation) > 1 else [])
    assert "ignore_eos" not in body and "prompt" not in body and body["max_completion_tokens"] == 64
    assert body["messages"][0] == {"role": "system", "content": conversation[0].system}
    assert body["messages"][-1] == {"role": "user", "content": conversation[-1].prompt}


def test_synthetic_bodies_still_force_their_length_with_ignore_eos(tokenizer: PromptTokenizer) -> None:
    [[spec]] = take(Workload(WorkloadSpec(input_len=8, output_len=4), tokenizer), 1)
    assert Target("http://127.0.0.1:1", "m").body(spec, [])["ignore_eos"] is True


def test_realistic_workload_refuses_options_it_cannot_honour() -> None:
    with pytest.raises(WorkloadError, match="realistic"):
        WorkloadSpec(realistic=True, turns=2)
    with pytest.raises(WorkloadError, match="realistic"):
        WorkloadSpec(realistic=True, system_prompt_len=8)
