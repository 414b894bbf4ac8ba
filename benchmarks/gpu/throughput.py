"""SmolLM2 offline throughput on nano-vllm's workload, through the real engine, Triton vs torch attention.

The workload is nano-vllm's bench.py: 256 requests, prompts of uniform 100..1024 random token ids, outputs of
uniform 100..1024 tokens with ignore_eos and temperature 0.6, all submitted at once. Each path gets a time
cap; a capped run reports the tokens it produced in that time instead of hanging the check.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import torch

from backend import Engine, EngineConfig, GenerateRequest, SamplingParams
from backend.executor.model.ops import triton_ops
from backend.loading.loader import LoadedModel, load_model
from benchmarks.gpu.decode import torch_attention_ops


def nano_vllm_workload(num_requests: int = 256, seed: int = 0) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(100, 1024))] for _ in range(num_requests)]
    return [
        (p, SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=rng.randint(100, 1024))) for p in prompts
    ]


def _engine(model_path: Path, loaded: LoadedModel) -> Engine:
    config = EngineConfig(
        model_path,
        device="cuda",
        dtype="bfloat16",
        max_num_seqs=256,
        max_num_batched_tokens=16384,
        max_model_len=4096,
        kv_cache_memory=16 << 30,
        max_waiting=1024,
        max_waiting_tokens=1 << 30,
        queue_timeout=3600.0,
    )
    engine = Engine(config, loaded=loaded)
    engine.start()
    return engine


async def _drive(engine: Engine, workload: list[tuple[list[int], SamplingParams]], cap_s: float) -> dict:
    produced = [0]

    async def one(i: int, prompt: list[int], params: SamplingParams) -> None:
        async for delta in engine.generate(GenerateRequest(f"bench-{i}", prompt, params)):
            produced[0] += len(delta.token_ids)

    start = time.perf_counter()
    tasks = [asyncio.create_task(one(i, p, sp)) for i, (p, sp) in enumerate(workload)]
    _, pending = await asyncio.wait(tasks, timeout=cap_s)
    elapsed = time.perf_counter() - start
    for task in pending:
        task.cancel()  # closing the generator aborts the request in the engine
    await asyncio.gather(*pending, return_exceptions=True)
    return {
        "completed": not pending,
        "seconds": round(elapsed, 2),
        "output_tokens": produced[0],
        "output_tokens_per_s": round(produced[0] / elapsed, 1),
    }


def run(model_path: Path, cap_s: float = 100.0) -> dict:
    """Output tokens per second of both attention paths on the same workload, and their ratio."""
    workload = nano_vllm_workload()
    warmup = [(p[:200], SamplingParams(max_tokens=8, ignore_eos=True)) for p, _ in workload[:4]]
    results: dict = {
        "requests": len(workload),
        "prompt_tokens": sum(len(p) for p, _ in workload),
        "max_output_tokens": sum(sp.max_tokens for _, sp in workload),
    }
    for name, ops in (("triton", triton_ops), ("torch", torch_attention_ops)):
        try:
            loaded = load_model(model_path, device="cuda", dtype=torch.bfloat16, ops=ops())
            engine = _engine(model_path, loaded)
            try:
                asyncio.run(_drive(engine, warmup, cap_s))  # compiles the kernels outside the timed run
                results[name] = asyncio.run(_drive(engine, workload, cap_s))
            finally:
                engine.shutdown()
        except Exception as exc:  # one failing path must not hide the other's figure
            results[name] = {"error": repr(exc)[:300]}
        torch.cuda.empty_cache()
    rates = [results[n].get("output_tokens_per_s") for n in ("triton", "torch")]
    results["triton_over_torch"] = round(rates[0] / rates[1], 2) if rates[0] and rates[1] else None
    return results
