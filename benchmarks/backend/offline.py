"""Offline engine benchmark against transformers' static batching, on the same GGUF model and threads.

    .venv/bin/python -m benchmarks.backend.offline --scenario all --threads 2

Scenarios: `fixed` (N requests of fixed input/output lengths, all submitted at once; transformers runs them
as one static batch), `mixed` (128 requests, input 32..512, output 16..256; transformers runs them in arrival
order in static batches of 32, each generating to its longest request), `batch1` (decode ms/step of one
request). Every request ignores EOS so both sides produce exactly the requested tokens; only those count.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backend.engine.core import Engine, EngineConfig
from backend.engine.sampling_params import SamplingParams
from backend.loading.model_cache import pull


@dataclass(slots=True)
class Job:
    prompt: list[int]
    output_len: int


def make_jobs(rng: random.Random, vocab: int, inputs: list[int], outputs: list[int]) -> list[Job]:
    # Ordinary text-token ids: the low ids of this vocabulary are special tokens.
    return [Job([rng.randrange(1000, vocab) for _ in range(i)], o) for i, o in zip(inputs, outputs, strict=True)]


def run_engine(engine: Engine, jobs: list[Job], label: str) -> float:
    """Submit every job at once; return useful output tokens per second."""
    params = [SamplingParams(max_tokens=j.output_len, ignore_eos=True, temperature=0.0) for j in jobs]
    done = threading.Event()

    def report() -> None:
        while not done.wait(10.0):
            s = engine.stats()
            print(f"  [{label}] steps={s.steps} running={s.num_running} waiting={s.num_waiting} "
                  f"kv={s.kv_usage:.0%} preemptions={s.num_preemptions}", flush=True)

    threading.Thread(target=report, daemon=True).start()
    start = time.perf_counter()
    results = engine.generate_offline([j.prompt for j in jobs], params)
    elapsed = time.perf_counter() - start
    done.set()
    produced = sum(len(r.token_ids) for r in results)
    assert produced == sum(j.output_len for j in jobs), "every request must produce exactly its tokens"
    return produced / elapsed


def run_transformers(hf: Any, jobs: list[Job], batch_size: int, label: str) -> float:
    """Static batches in arrival order, left-padded, each generating to its longest; useful tokens/s."""
    start = time.perf_counter()
    for first in range(0, len(jobs), batch_size):
        batch = jobs[first : first + batch_size]
        width = max(len(j.prompt) for j in batch)
        ids = torch.tensor([[0] * (width - len(j.prompt)) + j.prompt for j in batch])
        mask = torch.tensor([[0] * (width - len(j.prompt)) + [1] * len(j.prompt) for j in batch])
        longest = max(j.output_len for j in batch)
        t = time.perf_counter()
        with torch.inference_mode():
            hf.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                        do_sample=False, pad_token_id=0)
        print(f"  [{label}] batch {first // batch_size + 1}/{-(-len(jobs) // batch_size)}: "
              f"{len(batch)} x {width} in, {longest} out, {time.perf_counter() - t:.1f}s", flush=True)
    return sum(j.output_len for j in jobs) / (time.perf_counter() - start)


def engine_decode_ms(engine: Engine, prompt: list[int], steps: int) -> float:
    [result] = engine.generate_offline([prompt], SamplingParams(max_tokens=steps + 1, ignore_eos=True))
    times = result.timings.token_times
    return 1000 * (times[-1] - times[0]) / (len(times) - 1)


def transformers_decode_ms(hf: Any, prompt: list[int], steps: int) -> float:
    ids = torch.tensor([prompt])

    def timed(new: int) -> float:
        t = time.perf_counter()
        with torch.inference_mode():
            hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
        return time.perf_counter() - t

    timed(2)  # warm-up
    return 1000 * (timed(steps + 1) - timed(1)) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="a .gguf path or a model-cache name")
    parser.add_argument("--scenario", choices=["fixed", "mixed", "batch1", "all"], default="all")
    parser.add_argument("--num-requests", type=int, default=32, help="fixed scenario")
    parser.add_argument("--input-len", type=int, default=256, help="fixed scenario")
    parser.add_argument("--output-len", type=int, default=128, help="fixed scenario")
    parser.add_argument("--mixed-requests", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--kv-cache-memory", type=int, default=3 << 30, help="bytes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-baseline", action="store_true", help="skip transformers")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    path = Path(args.model) if args.model.endswith(".gguf") else pull(args.model, quiet=True)
    print(f"model {path.name}, {args.threads} threads, float32", flush=True)
    engine = Engine(EngineConfig(
        model_path=path, dtype="float32", threads=args.threads, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_memory=args.kv_cache_memory,
    ))
    engine.start()
    rng = random.Random(args.seed)
    vocab = engine.model_config.vocab_size
    scenarios = ("batch1", "fixed", "mixed") if args.scenario == "all" else (args.scenario,)
    n, i, o = args.num_requests, args.input_len, args.output_len
    prompt = make_jobs(rng, vocab, [32], [0])[0].prompt
    fixed = make_jobs(rng, vocab, [i] * n, [o] * n)
    m = args.mixed_requests
    mixed = make_jobs(rng, vocab, [rng.randint(32, 512) for _ in range(m)], [rng.randint(16, 256) for _ in range(m)])
    names = {
        "batch1": "batch-1 decode ms/step (32 in, 128 steps)",
        "fixed": f"fixed {n}x({i} in, {o} out) output tokens/s",
        "mixed": f"mixed {m} requests output tokens/s",
    }

    # One side at a time, each with the process to itself: the engine's step thread has ended (and its
    # OpenMP pool with it) before transformers loads, so neither side runs beside the other's idle threads.
    ours: dict[str, float] = {}
    for name in scenarios:
        print(f"tidegate {name}", flush=True)
        if name == "batch1":
            ours[name] = engine_decode_ms(engine, prompt, 128)
        else:
            ours[name] = run_engine(engine, fixed if name == "fixed" else mixed, f"tidegate {name}")
        print(f"  {names[name]}: {ours[name]:.1f}", flush=True)
    engine.shutdown()
    del engine
    theirs: dict[str, float] = {}
    if not args.no_baseline:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        hf.eval()
        for name in scenarios:
            print(f"transformers {name}", flush=True)
            if name == "batch1":
                theirs[name] = transformers_decode_ms(hf, prompt, 128)
            else:
                jobs = fixed if name == "fixed" else mixed
                theirs[name] = run_transformers(hf, jobs, n if name == "fixed" else 32, f"transformers {name}")
            print(f"  {names[name]}: {theirs[name]:.1f}", flush=True)

    rows: list[tuple[str, str, str, str]] = []
    for name in scenarios:
        unit, higher_is_better = ("ms", False) if name == "batch1" else ("tok/s", True)
        mine, base = ours[name], theirs.get(name)
        ratio = "" if base is None else f"{(mine / base if higher_is_better else base / mine):.2f}x"
        rows.append((names[name], f"{mine:.1f} {unit}", "-" if base is None else f"{base:.1f} {unit}", ratio))
    print("\n| measure | tidegate | transformers | speed-up |\n| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
