"""What the backend server costs on top of its engine: the same closed-loop workload, run in-process through
`Engine.generate()` (the baseline) and over HTTP+SSE through a real `tidegate backend` subprocess.

    .venv/bin/python -m benchmarks.backend.server_overhead --concurrency 8 --num-requests 48 --input-len 64 --output-len 32

Both sides get the same prompts (token ids, so tokenization is not compared), ignore EOS so every request
produces exactly `--output-len` tokens, and use the same torch thread count. TTFT is measured to the first
chunk with text, E2E to the last; TPOT = (E2E - TTFT) / (output tokens - 1), as vLLM's bench defines it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from backend.engine.core import Engine
from backend.engine.engine_config import EngineConfig
from backend.engine.records import GenerateRequest
from backend.engine.sampling_params import SamplingParams
from backend.loading.model_cache import pull


@dataclass(slots=True)
class Sample:
    ttft: float
    e2e: float
    tokens: int


async def closed_loop(prompts: list[list[int]], concurrency: int,
                      one: Callable[[int, list[int]], Awaitable[Sample]]) -> tuple[list[Sample], float]:
    queue = list(enumerate(prompts))
    samples: list[Sample] = []

    async def worker() -> None:
        while queue:
            i, prompt = queue.pop(0)
            samples.append(await one(i, prompt))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples, time.perf_counter() - start


async def run_engine(engine: Engine, prompts: list[list[int]], args: argparse.Namespace) -> tuple[list[Sample], float]:
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)

    async def one(i: int, prompt: list[int]) -> Sample:
        start, first, tokens = time.perf_counter(), 0.0, 0
        async for delta in engine.generate(GenerateRequest(f"bench-{i}", prompt, params)):
            if delta.text and not first:
                first = time.perf_counter()
            tokens = delta.completion_tokens
        return Sample(first - start, time.perf_counter() - start, tokens)

    return await closed_loop(prompts, args.concurrency, one)


async def run_server(url: str, prompts: list[list[int]], args: argparse.Namespace) -> tuple[list[Sample], float]:
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        async def one(i: int, prompt: list[int]) -> Sample:
            body = {"model": "smollm2", "prompt": prompt, "max_tokens": args.output_len, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            start, first, tokens = time.perf_counter(), 0.0, 0
            async with http.stream("POST", "/v1/completions", json=body) as answer:
                answer.raise_for_status()
                async for line in answer.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk["choices"] and chunk["choices"][0]["text"] and not first:
                        first = time.perf_counter()
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
            return Sample(first - start, time.perf_counter() - start, tokens)

        return await closed_loop(prompts, args.concurrency, one)


def summary(samples: list[Sample], duration: float) -> dict[str, float]:
    def pct(values: list[float], q: float) -> float:
        return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000

    ttft = [s.ttft for s in samples]
    tpot = [(s.e2e - s.ttft) / (s.tokens - 1) for s in samples if s.tokens > 1]
    e2e = [s.e2e for s in samples]
    return {"median_ttft_ms": statistics.median(ttft) * 1000, "p95_ttft_ms": pct(ttft, 0.95),
            "median_tpot_ms": statistics.median(tpot) * 1000, "p95_tpot_ms": pct(tpot, 0.95),
            "median_e2el_ms": statistics.median(e2e) * 1000, "p95_e2el_ms": pct(e2e, 0.95),
            "output_throughput": sum(s.tokens for s in samples) / duration}


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"backend at {url} did not become healthy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--num-requests", type=int, default=48)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = pull("smollm2", quiet=True)
    rng = random.Random(args.seed)

    engine = Engine(EngineConfig(model_path=model, threads=args.threads))
    # Ordinary text-token ids: the low ids of this vocabulary are special tokens.
    prompts = [[rng.randrange(1000, engine.model_config.vocab_size) for _ in range(args.input_len)]
               for _ in range(args.num_requests)]
    engine.start()
    asyncio.run(run_engine(engine, prompts[:2], args))  # warm-up
    rows = {"engine (in-process)": summary(*asyncio.run(run_engine(engine, prompts, args)))}
    engine.shutdown()
    del engine

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "-m", "tidegate", "backend", "--model", str(model),
                                 "--served-model-name", "smollm2", "--port", str(port), "--threads",
                                 str(args.threads)], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "TIDEGATE_BACKEND__LOG_LEVEL": "warning"},
                                cwd=Path(__file__).resolve().parents[2])
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, proc)
            asyncio.run(run_server(url, prompts[:2], args))
            rows["server (HTTP + SSE)"] = summary(*asyncio.run(run_server(url, prompts, args)))
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    keys = list(next(iter(rows.values())))
    print("| side | " + " | ".join(keys) + " |")
    print("| --- " * (len(keys) + 1) + "|")
    for side, values in rows.items():
        print(f"| {side} | " + " | ".join(f"{values[k]:.1f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
