"""The backend server end to end: the official openai client against a real `tidegate backend` on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import gguf
import httpx
import numpy as np
import openai
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from backend import Delta, Engine, EngineConfig, GenerateRequest
from backend.engine.sampling_params import SamplingParams
from backend.executor.cpu import block_kernel
from backend.loading.loader import LoadedModel
from backend.server.app import BackendServer, create_app, served_model_name
from backend.server.tracing import setup_backend_tracing
from config.backend import BackendSettings
from config.gateway import Tracing
from tests.backend.backend_process import BackendProcess
from tests.servers import free_port

PROMPT = "The three primary colors are"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a fruit."}]
CLIENTS = 32
IGNORE_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def served(model_path: Path, loaded_model: LoadedModel,
           shared_backend: BackendProcess) -> tuple[BackendProcess, Engine]:
    """The server under test (the session's, with default flags), and the same model run offline in this process
    (the reference for greedy outputs) over the session's loaded model."""
    engine = Engine(EngineConfig(model_path=model_path, kv_cache_memory=64 * 1024 * 1024, threads=1),
                    loaded=loaded_model)
    return shared_backend, engine


@pytest.fixture(scope="module")
def backend_server(served: tuple[BackendProcess, Engine]) -> BackendProcess:
    return served[0]


@pytest.fixture(scope="module")
def offline(served: tuple[BackendProcess, Engine]) -> Engine:
    return served[1]


@pytest.fixture(scope="module")
def refs(offline: Engine) -> dict[str, Any]:
    """Greedy offline results (8 tokens, EOS ignored) for the module's prompts, computed in one batch."""
    prompts = {"completion": prompt_ids(offline, PROMPT), "chat": prompt_ids(offline, messages=MESSAGES)}
    for i in range(0, CLIENTS, 2):  # the clients that stay to the end
        prompts[f"client-{i}"] = prompt_ids(offline, client_prompt(i))
    done = offline.generate_offline(list(prompts.values()),
                                    SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    return {name: (ids, result) for (name, ids), result in zip(prompts.items(), done, strict=True)}


@pytest.fixture
def client(backend_server: BackendProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=backend_server.base_url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def aclient(backend_server: BackendProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=backend_server.base_url, api_key="unused", max_retries=0, timeout=60)


def client_prompt(i: int) -> str:
    return f"Client {i} asks: what comes after {i}?"


def prompt_ids(engine: Engine, prompt: str | None = None, messages: list[dict[str, str]] | None = None) -> list[int]:
    tok = engine.tokenizer
    if messages is not None:
        return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)
    assert prompt is not None
    return tok.encode(prompt, add_special_tokens=True)


def test_health_answers_503_while_loading_then_200(backend_server: BackendProcess) -> None:
    assert backend_server.first_health == (503, {"status": "loading"})
    assert httpx.get(backend_server.url + "/health").json() == {"status": "ok"}


def test_the_ready_line_says_how_decode_steps_run(backend_server: BackendProcess) -> None:
    ready = [line for line in backend_server.log().splitlines() if " ready as " in line]
    assert len(ready) == 1
    # the default Q4_1 model in blocks, with the extension built: the layers go to C++ in one call
    built = block_kernel.load() is not None
    assert ("decode steps: layers in one C++ call" if built else "decode steps: the Python layer loop") in ready[0]


def test_models_lists_the_served_name(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == ["smollm2"]
    assert models[0].owned_by == "tidegate"


def test_completion_equals_offline_greedy_with_exact_usage(client: openai.OpenAI, refs: dict[str, Any]) -> None:
    ids, ref = refs["completion"]
    got = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0,
                                    extra_body=IGNORE_EOS)
    assert got.object == "text_completion" and got.id.startswith("cmpl-")
    assert got.choices[0].text == ref.text
    assert got.choices[0].finish_reason == "length"
    assert got.usage is not None
    assert (got.usage.prompt_tokens, got.usage.completion_tokens, got.usage.total_tokens) == (len(ids), 8,
                                                                                              len(ids) + 8)


def test_chat_equals_offline_greedy_through_the_chat_template(client: openai.OpenAI, refs: dict[str, Any]) -> None:
    ids, ref = refs["chat"]
    got = client.chat.completions.create(model="smollm2", messages=MESSAGES,  # type: ignore[arg-type]
                                         max_tokens=8, temperature=0, extra_body=IGNORE_EOS)
    assert got.object == "chat.completion" and got.id.startswith("chatcmpl-")
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == ref.text
    assert got.choices[0].finish_reason == "length"
    assert got.usage is not None and (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(ids), 8)


async def test_async_chat_stream_matches_offline_and_ends_with_a_usage_chunk(
        aclient: openai.AsyncOpenAI, refs: dict[str, Any]) -> None:
    ids, ref = refs["chat"]
    stream = await aclient.chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=8, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True}, extra_body=IGNORE_EOS)
    chunks = [chunk async for chunk in stream]
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(ids), 8)


async def test_async_completion_stream_without_usage_option(aclient: openai.AsyncOpenAI,
                                                            refs: dict[str, Any]) -> None:
    stream = await aclient.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0,
                                              stream=True, extra_body=IGNORE_EOS)
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks) == refs["completion"][1].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None and len(c.choices) == 1 for c in chunks)


def test_sync_stream_of_a_chat(client: openai.OpenAI, refs: dict[str, Any]) -> None:
    stream = client.chat.completions.create(model="smollm2", messages=MESSAGES,  # type: ignore[arg-type]
                                            max_tokens=8, temperature=0, stream=True, extra_body=IGNORE_EOS)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == refs["chat"][1].text


def test_stop_string_trims_the_output_and_finishes_with_stop(client: openai.OpenAI, refs: dict[str, Any]) -> None:
    text = refs["completion"][1].text
    stop = text.split()[2]
    got = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop],
                                    extra_body=IGNORE_EOS)
    assert got.choices[0].finish_reason == "stop"
    assert got.choices[0].text == text[: text.index(stop)]


def test_ignore_eos_gives_exact_lengths_and_priority_is_accepted(client: openai.OpenAI) -> None:
    got = client.completions.create(model="smollm2", prompt="Hi", max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True, "priority": -1})
    assert got.usage is not None and got.usage.completion_tokens == 6
    assert got.choices[0].finish_reason == "length"


def test_min_tokens_holds_back_the_end_of_sequence(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Say yes."}],
                                          max_completion_tokens=6, temperature=0, extra_body={"min_tokens": 6})
    assert chat.usage is not None and chat.usage.completion_tokens == 6
    assert chat.choices[0].finish_reason == "length"


def test_repeated_prompt_reports_cached_tokens(client: openai.OpenAI) -> None:
    prompt = "Tidegate caches prefixes. " * 12
    first = client.completions.create(model="smollm2", prompt=prompt, max_tokens=1, temperature=0)
    second = client.completions.create(model="smollm2", prompt=prompt, max_tokens=1, temperature=0)
    assert first.usage is not None and second.usage is not None
    cached = second.usage.prompt_tokens_details
    assert cached is not None and cached.cached_tokens is not None
    assert 16 <= cached.cached_tokens < second.usage.prompt_tokens
    assert cached.cached_tokens % 16 == 0  # whole blocks only


def test_seed_makes_sampling_reproducible(client: openai.OpenAI) -> None:
    texts = {client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=6, temperature=1.0,
                                       seed=1234).choices[0].text for _ in range(2)}
    assert len(texts) == 1


BAD_REQUESTS: list[tuple[dict[str, Any], str]] = [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": "ten"}, "max_tokens"),
    ({"temperature": 7}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"n": 17}, "n"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logit_bias": {"999999": 1}}, "logit_bias"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"max_tokens": 9000}, "max_tokens"),
    ({"stop_token_ids": [10**9]}, "stop_token_ids"),
]


@pytest.mark.parametrize("fields, param", BAD_REQUESTS)
def test_bad_requests_raise_bad_request_error_naming_the_param(client: openai.OpenAI, fields: dict[str, Any],
                                                               param: str) -> None:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="smollm2", messages=body.pop("messages"), extra_body=body)
    err = caught.value
    assert isinstance(err.body, dict) and err.body["param"] == param
    assert err.body["type"] == "invalid_request_error"


def test_prompt_over_the_context_window_is_context_length_exceeded(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="smollm2", prompt=[1] * 8192, max_tokens=1)
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "context_length_exceeded"


def test_unknown_model_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-9", prompt="hi", max_tokens=1)
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "model_not_found"


def test_body_over_the_limit_is_413_declared_or_chunked(client: openai.OpenAI,
                                                        backend_server: BackendProcess) -> None:
    limit = BackendSettings().max_body_bytes
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(model="smollm2", prompt="x" * (limit + 4096), max_tokens=1)
    assert caught.value.status_code == 413

    def chunked() -> Any:  # no Content-Length: the limit must hold while reading
        yield b'{"model": "smollm2", "prompt": "'
        for _ in range(limit // 1024 + 16):
            yield b"y" * 1024
        yield b'"}'

    answer = httpx.post(backend_server.base_url + "/completions", content=chunked(),
                        headers={"content-type": "application/json"})
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("raw, code", [(b"{not json", "invalid_json"), (b'{"model": "\xff"}', "invalid_encoding"),
                                       (b'["a"]', "invalid_json")])
def test_undecodable_bodies_get_openai_shaped_400s(backend_server: BackendProcess, raw: bytes, code: str) -> None:
    answer = httpx.post(backend_server.base_url + "/chat/completions", content=raw)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code


def test_request_id_is_echoed_and_logged_once_with_its_timings(client: openai.OpenAI,
                                                               backend_server: BackendProcess) -> None:
    raw = client.completions.with_raw_response.create(model="smollm2", prompt="Hi", max_tokens=3, temperature=0,
                                                      extra_headers={"x-request-id": "log-test-1"})
    assert raw.headers["x-request-id"] == "log-test-1"
    lines = [line for line in backend_server.request_lines() if line["request_id"] == "log-test-1"]
    assert len(lines) == 1
    line = lines[0]
    assert (line["status"], line["completion_tokens"], line["finish_reason"]) == (200, 3, "length")
    assert line["prompt_tokens"] > 0 and line["response_id"] == raw.parse().id
    assert 0 <= line["queue_time"] <= line["ttft"] <= line["e2e"]


async def test_32_streams_with_half_disconnecting_leave_the_rest_correct_and_the_engine_idle(
        backend_server: BackendProcess, aclient: openai.AsyncOpenAI, refs: dict[str, Any]) -> None:
    idle_kv = backend_server.metrics()["tidegate_backend_kv_cache_usage_perc"]
    rng = random.Random(4)

    async def finisher(i: int) -> str:
        stream = await aclient.completions.create(model="smollm2", prompt=client_prompt(i), max_tokens=8,
                                                  temperature=0, stream=True, extra_body=IGNORE_EOS)
        return "".join([c.choices[0].text async for c in stream])

    async def leaver_after_chunks(i: int, chunks: int) -> None:
        stream = await aclient.completions.create(model="smollm2", prompt=client_prompt(i), max_tokens=8,
                                                  temperature=0, stream=True, extra_body=IGNORE_EOS)
        seen = 0
        async for _ in stream:
            seen += 1
            if seen >= chunks:
                break
        await stream.close()

    async def leaver_after_delay(i: int, delay: float) -> None:  # may leave before the first byte
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(finisher(i), delay)

    tasks: dict[int, asyncio.Task[Any]] = {}
    for i in range(CLIENTS):
        if i % 2 == 0:
            tasks[i] = asyncio.create_task(finisher(i))
        elif i % 4 == 1:
            tasks[i] = asyncio.create_task(leaver_after_chunks(i, rng.randint(1, 5)))
        else:
            tasks[i] = asyncio.create_task(leaver_after_delay(i, rng.uniform(0.0, 1.0)))
    await asyncio.wait_for(asyncio.gather(*tasks.values()), 120)

    for i in range(0, CLIENTS, 2):
        assert tasks[i].result() == refs[f"client-{i}"][1].text, f"client {i}"
    metrics = await asyncio.to_thread(backend_server.wait_idle, idle_kv)
    assert metrics["tidegate_backend_num_requests_running"] == 0
    assert metrics["tidegate_backend_num_requests_waiting"] == 0
    assert metrics["tidegate_backend_kv_cache_usage_perc"] <= idle_kv
    assert metrics['tidegate_backend_request_success_total{"finished_reason": "abort"}'] >= 1


def test_non_streaming_client_that_leaves_aborts_its_request(backend_server: BackendProcess) -> None:
    idle_kv = backend_server.metrics()["tidegate_backend_kv_cache_usage_perc"]
    body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(backend_server.base_url + "/completions", json=body, timeout=httpx.Timeout(5.0, read=1.0),
                   headers={"x-request-id": "leaves-early"})
    metrics = backend_server.wait_idle(idle_kv)
    assert metrics["tidegate_backend_num_requests_running"] == 0
    assert metrics["tidegate_backend_kv_cache_usage_perc"] <= idle_kv
    line = wait_for_log_line(backend_server, "leaves-early")
    assert (line["status"], line["finish_reason"]) == (499, "abort")


def wait_for_log_line(server: BackendProcess, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in server.request_lines():
            if line["request_id"] == request_id:
                return line
        time.sleep(0.05)
    raise AssertionError(f"no log line for {request_id}")


@pytest.fixture
def faulty_app(offline: Engine, model_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[openai.AsyncOpenAI]:
    """An in-process server over the offline engine, whose `generate` is replaced to produce one fault."""
    server = BackendServer(BackendSettings(), model_path, "smollm2")
    server.serving.engine = offline
    transport = httpx.ASGITransport(app=server.app)
    yield openai.AsyncOpenAI(base_url="http://backend/v1", api_key="unused", max_retries=0,
                             http_client=httpx.AsyncClient(transport=transport))


async def test_an_internal_error_is_a_500_in_the_openai_shape(faulty_app: openai.AsyncOpenAI, offline: Engine,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    async def broken(request: GenerateRequest) -> AsyncIterator[Delta]:
        raise RuntimeError("kernel exploded")
        yield  # pragma: no cover - makes this an async generator like the real one

    monkeypatch.setattr(offline, "generate", broken)
    with pytest.raises(openai.InternalServerError) as caught:
        await faulty_app.completions.with_raw_response.create(model="smollm2", prompt="hi", max_tokens=2,
                                                              extra_headers={"x-request-id": "boom-1"})
    assert caught.value.status_code == 500
    assert isinstance(caught.value.body, dict) and caught.value.body["type"] == "server_error"
    assert "boom-1" in caught.value.body["message"] and "kernel" not in caught.value.body["message"]
    assert any("boom-1" in r.getMessage() and r.exc_info for r in caught_records(caplog))


async def test_a_failure_after_the_first_chunk_ends_the_stream_with_an_error_event(
        faulty_app: openai.AsyncOpenAI, offline: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    async def breaks_midway(request: GenerateRequest) -> AsyncIterator[Delta]:
        yield Delta(request.request_id, "Hello", [1], None, len(request.prompt_token_ids), 1, 0)
        raise RuntimeError("lost the device")

    monkeypatch.setattr(offline, "generate", breaks_midway)
    stream = await faulty_app.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}],
                                                      max_tokens=4, stream=True)
    received = []
    with pytest.raises(openai.APIError) as caught:
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content)
    assert received == ["", "Hello"]
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "internal_error"


async def test_an_engine_abort_while_the_client_waits_is_a_500(faulty_app: openai.AsyncOpenAI, offline: Engine,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    async def aborted(request: GenerateRequest) -> AsyncIterator[Delta]:
        yield Delta(request.request_id, "", [], "abort", len(request.prompt_token_ids), 0, 0)

    monkeypatch.setattr(offline, "generate", aborted)
    with pytest.raises(openai.InternalServerError):
        await faulty_app.completions.create(model="smollm2", prompt="hi", max_tokens=2)


def caught_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("tidegate.backend")]


async def test_a_traced_request_emits_spans_joined_to_the_callers_trace(offline: Engine, model_path: Path) -> None:
    exporter = InMemorySpanExporter()
    server = BackendServer(BackendSettings(), model_path, "smollm2")
    server.serving.engine = offline
    server.serving.tracing = setup_backend_tracing(Tracing(exporter="console"), exporter)
    offline.start()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=server.app), base_url="http://backend") as http:
        answer = await http.post("/v1/completions", json={"model": "smollm2", "prompt": "Hi", "max_tokens": 2},
                                 headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
    assert answer.status_code == 200
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert {"POST /v1/completions", "engine.queue", "engine.prefill", "engine.decode"} <= set(spans)
    assert all(format(span.context.trace_id, "032x") == trace_id for span in spans.values())
    assert spans["POST /v1/completions"].attributes["gen_ai.usage.output_tokens"] == 2


@pytest.mark.parametrize("method, path, status", [("GET", "/v1/completions", 405), ("POST", "/v1/embeddings", 404),
                                                  ("GET", "/nowhere", 404)])
def test_unknown_routes_and_methods_answer_in_the_openai_shape(backend_server: BackendProcess, method: str,
                                                               path: str, status: int) -> None:
    answer = httpx.request(method, backend_server.url + path)
    assert answer.status_code == status
    assert set(answer.json()["error"]) == {"message", "type", "param", "code"}


def test_a_long_prompt_is_tokenized_off_the_event_loop_and_counted_exactly(client: openai.OpenAI,
                                                                          offline: Engine) -> None:
    prompt = "The tide comes in and the tide goes out. " * 300  # over the off-loop threshold
    with pytest.raises(openai.BadRequestError) as caught:  # the refusal counts the prompt without running it
        client.completions.create(model="smollm2", prompt=prompt, max_tokens=8192)
    assert f"({len(prompt_ids(offline, prompt))} in the prompt, 8192 in the completion)" in caught.value.message


def test_a_client_that_stops_reading_does_not_hold_up_the_others(backend_server: BackendProcess,
                                                                 client: openai.OpenAI, refs: dict[str, Any]) -> None:
    idle_kv = backend_server.metrics()["tidegate_backend_kv_cache_usage_perc"]
    body = json.dumps({"model": "smollm2", "prompt": "Never read", "max_tokens": 2000, "stream": True,
                       "ignore_eos": True}).encode()
    with socket.socket() as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # its window fills after a few chunks
        stalled.connect(("127.0.0.1", backend_server.port))
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 30
        while backend_server.metrics()["tidegate_backend_num_requests_running"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for _ in range(2):
            stream = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0,
                                               stream=True, extra_body=IGNORE_EOS)
            assert "".join(c.choices[0].text for c in stream) == refs["completion"][1].text
        assert backend_server.metrics()["tidegate_backend_num_requests_running"] == 1  # still stuck, alone
    assert backend_server.wait_idle(idle_kv)["tidegate_backend_num_requests_running"] == 0


def test_a_model_that_cannot_load_ends_the_process_with_status_1(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    done = subprocess.run([sys.executable, "-m", "tidegate", "backend", "--model", str(bad), "--port",
                           str(free_port())], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "loading" in done.stderr and "broken.gguf" in done.stderr


def test_an_unsupported_architecture_is_refused_at_start_in_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    done = subprocess.run([sys.executable, "-m", "tidegate", "backend", "--model", str(path), "--port",
                           str(free_port())], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    refusals = [line for line in done.stderr.splitlines() if "unsupported architecture 'mamba'" in line]
    assert len(refusals) == 1 and "mamba.gguf" in refusals[0]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("model, flag, expected", [("smollm2", None, "smollm2"), ("smollm2", "mine", "mine"),
                                                   ("/m/Qwen2-0.5B.Q8_0.gguf", None, "Qwen2-0.5B.Q8_0")])
def test_the_served_name_follows_the_model_flag(model: str, flag: str | None, expected: str) -> None:
    settings = BackendSettings(model=model, served_model_name=flag)
    assert served_model_name(settings, Path(model)) == expected


async def test_before_the_model_loads_completions_get_503_with_retry_after(model_path: Path) -> None:
    app = create_app(BackendSettings(), model_path, "smollm2")  # lifespan not run: the model never loads
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://backend") as http:
        health = await http.get("/health")
        answer = await http.post("/v1/completions", json={"model": "smollm2", "prompt": "hi"})
        models = await http.get("/v1/models")
    assert (health.status_code, health.json()) == (503, {"status": "loading"})
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "model_loading"
    assert int(answer.headers["retry-after"]) >= 1
    assert models.json()["data"][0]["id"] == "smollm2"
