"""Time of one engine-shaped decode step of the model, alone: B sequences, each C tokens of context.

    .venv/bin/python -m benchmarks.backend.decode_step --batch 1,8,32 --context 320 --threads 2 [--prefill 256]
        [--model ~/.cache/tidegate/real-shapes/llama3.2-1b/Q4_K_M.gguf --quantization auto]

The model runs its forward and logits over a paged cache with each sequence's blocks scattered through the
pool (or, with `--consecutive`, in order, as a fresh pool hands them out), as the runner does, with fresh metadata and one attention plan per step. Reports the median step, the
median time (wall and process CPU) of the weight matrix products alone for the same rows, and with `--profile` the top torch ops of
three steps; `--batch` takes a list, measured one after the other in one process; `--prefill 256` also times one sequence's
first prefill step of 256 prompt tokens (logits of its last row only, as the runner asks); `--verify 2,4,6` also
times steps whose every sequence verifies that many draft tokens (1 + k query rows, logits of each). `--thread` runs the steps in a second thread, as the engine's step loop does. Only the public
model API is used (`load_model`, `model.ops`, `model(...)`, `compute_logits`), and checkouts from before
`model.ops` are measured the same way, so the script compares a change against its base. `--kv-cache-dtype
float32,float16` times each cache dtype (the first is the one the other lines use), and the decode steps of the
first two alternating, step by step, so that both see the same load. `--ab-torch-rows`
also times the step with torch's row-wise ops (norms, rotation, SiLU-and-mul: `torch_ops()`'s) in place of the
model's own, alternating step by step, so that both see the same load of a shared machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from backend.executor.attention.base import AttentionMetadata
from backend.executor.model.layer import DecoderLayer
from backend.executor.model.model import LlamaModel
from backend.executor.model.ops import ModelOps, torch_ops
from backend.loading.loader import load_model
from backend.loading.model_cache import pull

BLOCK = 16


def _caches(model: LlamaModel, num_blocks: int, fill: Callable[..., torch.Tensor],
            dtype: torch.dtype = torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    cfg = model.config
    shape = (num_blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim)
    return [(fill(shape).to(dtype), fill(shape).to(dtype)) for _ in range(cfg.num_layers)]


def _forward(model: LlamaModel, meta: AttentionMetadata, ids: torch.Tensor, positions: torch.Tensor,
             caches: list[tuple[torch.Tensor, torch.Tensor]], last_row_only: bool = False) -> None:
    """The model's forward and logits for one step, planned as the runner plans it."""
    ops = getattr(model, "ops", None)  # older checkouts planned inside the model, from the metadata
    plan = meta if ops is None else ops.attention.plan(meta, BLOCK, caches[0][0].dtype)
    hidden = model(ids, positions, caches, plan)
    model.compute_logits(hidden[-1:] if last_row_only else hidden)


def step_fn(model: LlamaModel, batch: int, context: int, consecutive: bool = False, rows: int = 1,
            kv_dtype: torch.dtype = torch.float32) -> Callable[[], None]:
    """B sequences of C tokens of context in a cache of `kv_dtype`, each computing its last `rows` tokens (1: a
    decode; 1 + k: the verification of k draft tokens), with the logits of every row."""
    cfg = model.config
    per_seq = -(-context // BLOCK)
    num_blocks = batch * per_seq + 8
    caches = _caches(model, num_blocks, torch.randn, kv_dtype)
    order = torch.arange(num_blocks) if consecutive else torch.randperm(num_blocks)
    tables = order[: batch * per_seq].view(batch, per_seq).int()
    ids = torch.randint(1000, cfg.vocab_size, (batch * rows,))
    offsets = torch.arange(context - rows, context)
    positions = offsets.repeat(batch)
    slots = (tables[:, offsets // BLOCK].long() * BLOCK + offsets % BLOCK).reshape(-1)

    def step() -> None:
        meta = AttentionMetadata(
            torch.arange(batch + 1, dtype=torch.int32) * rows, torch.full((batch,), context, dtype=torch.int32),
            tables.clone(), slots.clone(), rows, context,
        )
        _forward(model, meta, ids, positions, caches)

    return step


def prefill_fn(model: LlamaModel, tokens: int, kv_dtype: torch.dtype = torch.float32) -> Callable[[], None]:
    """One sequence's first prefill chunk of `tokens` prompt tokens over an empty cache, logits of its last row."""
    per_seq = -(-tokens // BLOCK)
    caches = _caches(model, per_seq, torch.zeros, kv_dtype)
    table = torch.arange(per_seq, dtype=torch.int32)[None]
    ids = torch.randint(1000, model.config.vocab_size, (tokens,))
    positions = torch.arange(tokens)

    def step() -> None:
        meta = AttentionMetadata(torch.tensor([0, tokens], dtype=torch.int32), torch.tensor([tokens], dtype=torch.int32),
                                 table.clone(), torch.arange(tokens), tokens, tokens)
        _forward(model, meta, ids, positions, caches, last_row_only=True)

    return step


def products_fn(model: LlamaModel, batch: int) -> Callable[[], None]:
    """The step's weight matrix products alone (including the output head), through the model's own linear."""
    cfg = model.config
    x = torch.randn(batch, cfg.hidden_size)
    o_in = torch.randn(batch, cfg.num_heads * cfg.head_dim)
    down_in = torch.randn(batch, cfg.intermediate_size)

    def products() -> None:
        layer: Any
        for layer in model.layers:
            # Older checkouts kept the product on each layer, and before that had only F.linear.
            linear = model.ops.linear if hasattr(model, "ops") else getattr(layer, "linear", F.linear)
            for rows, weight in ((x, layer.qkv_proj), (o_in, layer.o_proj), (x, layer.gate_up_proj),
                                 (down_in, layer.down_proj)):
                # Quantized forms (--quantization) carry their own product.
                weight.linear(rows) if hasattr(weight, "linear") else linear(rows, weight)
        model.compute_logits(x)

    return products


def median_ms(fn: Callable[[], None], runs: int) -> tuple[float, float]:
    """Median wall and process CPU milliseconds of one call: on a shared machine the CPU time is the steadier."""
    fn()
    walls, cpus = [], []
    for _ in range(runs):
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return 1000 * statistics.median(walls), 1000 * statistics.median(cpus)


def with_torch_rows(ops: ModelOps) -> ModelOps:
    """`ops` with the torch reference's row-wise ops: the same products and attention."""
    reference = torch_ops()
    return dataclasses.replace(ops, rms_norm=reference.rms_norm, add_rms_norm=reference.add_rms_norm,
                               rotary=reference.rotary, silu_and_mul=reference.silu_and_mul)


def running(model: LlamaModel, ops: ModelOps, step: Callable[[], None]) -> Callable[[], None]:
    """`step` with the model's layers calling `ops`."""

    def run() -> None:
        model.ops, model.rotary.op = ops, ops.rotary
        for layer in model.layers:
            assert isinstance(layer, DecoderLayer)
            layer.ops = ops
        step()

    return run


def paired_cpu_ms(first: Callable[[], None], second: Callable[[], None], runs: int) -> tuple[float, float, float]:
    """Median process CPU ms of each, run in alternating order, and the median of the pairs' differences."""
    first()
    second()
    pairs = []
    for i in range(runs):
        times = {}
        for name, fn in ((0, first), (1, second)) if i % 2 == 0 else ((1, second), (0, first)):
            cpu = time.process_time()
            fn()
            times[name] = 1000 * (time.process_time() - cpu)
        pairs.append((times[0], times[1]))
    return (statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs),
            statistics.median(p[0] - p[1] for p in pairs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="32", help="sequences per step; a comma-separated list for several")
    parser.add_argument("--context", type=int, default=320)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--thread", action="store_true", help="run the steps in a second thread")
    parser.add_argument("--consecutive", action="store_true",
                        help="give each sequence consecutive blocks, as a fresh pool does, instead of scattered ones")
    parser.add_argument("--profile", action="store_true",
                        help="print the top torch ops of three steps, and the torch calls a step makes")
    parser.add_argument("--profile-rows", type=int, default=8, help="how many ops --profile lists")
    parser.add_argument("--quantization", default="none", choices=["auto", "none", "int8", "int4"])
    parser.add_argument("--model", type=Path, default=None,
                        help="a GGUF file or HF folder (default: SmolLM2), e.g. a benchmarks.backend.real_shapes file")
    parser.add_argument("--prefill", default="", help="also time one sequence's prefill step of these prompt lengths")
    parser.add_argument("--verify", default="0",
                        help="draft tokens each sequence verifies (0: a plain decode); a comma-separated list for several")
    parser.add_argument("--ab-torch-rows", action="store_true",
                        help="also time steps with torch's row-wise ops, alternating with the model's own")
    parser.add_argument("--kv-cache-dtype", default="float32",
                        help="the KV cache's dtype; a comma-separated list times each (float32, float16, bfloat16)")
    args = parser.parse_args()
    kv_dtypes = [getattr(torch, name) for name in args.kv_cache_dtype.split(",")]
    torch.set_num_threads(args.threads)
    model = load_model(args.model or pull("smollm2", quiet=True), quantization=args.quantization).model
    batches = [int(b) for b in args.batch.split(",")]
    drafts = [int(k) for k in args.verify.split(",")]
    results: dict[tuple[int, int], tuple[tuple[float, float], tuple[float, float]]] = {}
    ab: dict[int, tuple[float, float, float]] = {}
    by_kv: dict[tuple[int, torch.dtype], tuple[float, float]] = {}
    kv_pairs: dict[int, tuple[float, float, float]] = {}
    prefills: dict[int, tuple[float, float]] = {}

    own = model.ops if args.ab_torch_rows else None  # checkouts from before model.ops run without the A/B

    def measure() -> None:
        with torch.inference_mode():
            for batch in batches:
                for k in drafts:
                    step = step_fn(model, batch, args.context, args.consecutive, 1 + k, kv_dtypes[0])
                    results[batch, k] = (median_ms(step, args.runs),
                                         median_ms(products_fn(model, batch * (1 + k)), args.runs))
                if len(kv_dtypes) > 1:
                    steps = [step_fn(model, batch, args.context, args.consecutive, 1, d) for d in kv_dtypes]
                    for dtype, step in zip(kv_dtypes, steps, strict=True):
                        by_kv[batch, dtype] = median_ms(step, args.runs)
                    kv_pairs[batch] = paired_cpu_ms(steps[0], steps[1], args.runs)
                if own is None and not args.profile:
                    continue
                step = step_fn(model, batch, args.context, args.consecutive)  # a paged cache of its own: only if used
                if own is not None:
                    ab[batch] = paired_cpu_ms(running(model, with_torch_rows(own), step), running(model, own, step),
                                              args.runs)
                    running(model, own, lambda: None)()  # the model's own ops again, for what follows
                if args.profile:
                    with torch.profiler.profile() as prof:
                        for _ in range(3):
                            step()
                    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile_rows))
                    # The ops Python called, not those they called in turn.
                    calls = sum(1 for event in prof.events() if event.cpu_parent is None)
                    print(f"batch {batch}: {calls / 3:.0f} torch calls per step")
            for tokens in (int(n) for n in args.prefill.split(",") if n):
                prefills[tokens] = median_ms(prefill_fn(model, tokens, kv_dtypes[0]), args.runs)
    if args.thread:
        worker = threading.Thread(target=measure)
        worker.start()
        worker.join()
    else:
        measure()
    where = "a second thread" if args.thread else "the main thread"
    for (batch, k), ((step_ms, step_cpu), (products_ms, products_cpu)) in results.items():
        kind = f"decode step, batch {batch}" if k == 0 else f"verification step, batch {batch} x (1 + {k} rows)"
        print(f"{kind}, context {args.context}, {args.threads} threads, in {where}: "
              f"{step_ms:.1f} ms median ({step_cpu:.1f} CPU ms); weight products alone {products_ms:.1f} ms "
              f"({products_cpu:.1f} CPU ms)")
    for tokens, (prefill_ms, prefill_cpu) in prefills.items():
        print(f"prefill step, {tokens} prompt tokens, {args.threads} threads: {prefill_ms:.1f} ms median "
              f"({prefill_cpu:.1f} CPU ms)")
    for (batch, dtype), (step_ms, step_cpu) in by_kv.items():
        print(f"decode step, batch {batch}, context {args.context}, {str(dtype).removeprefix('torch.')} KV cache: "
              f"{step_ms:.1f} ms median ({step_cpu:.1f} CPU ms)")
    names = [str(d).removeprefix("torch.") for d in kv_dtypes]
    for batch, (first_ms, second_ms, saved_ms) in kv_pairs.items():
        print(f"batch {batch}, alternating: {names[0]} KV {first_ms:.1f} CPU ms, {names[1]} KV {second_ms:.1f}; "
              f"median difference of {args.runs} pairs {saved_ms:.1f} CPU ms")
    for batch, (torch_ms, own_ms, saved_ms) in ab.items():
        print(f"batch {batch}, alternating: torch's row-wise ops {torch_ms:.1f} CPU ms, the model's {own_ms:.1f}; "
              f"median difference of {args.runs} pairs {saved_ms:.1f} CPU ms")


if __name__ == "__main__":
    main()
