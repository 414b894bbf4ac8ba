"""Where a burst's prefill time goes: N prompts arriving at once, against the engine with the default model.

    .venv/bin/python -m benchmarks.backend.prefill_burst [--num-requests 32] [--input-len 256] [--output-len 128]
        [--threads 2] [--max-num-batched-tokens 1024] [--repeats 5]

First one prompt alone, `--repeats` times: the ms of its prefill step (the whole step, and the block kernel's
GEMMs within it). Then the burst: every request submitted at once (closed over, `ignore_eos`), each step timed by
part: scheduling, the block-kernel products of more than 8 rows (the prefill GEMM), those of 1 to 8 rows,
attention (KV writes and attends), the logits, sampling, and the rest of the model (norms, RoPE, SwiGLU,
embedding, the fused decode stack). Reported for the steps before the last first token (what TTFT waits on) and
after, with the requests' TTFT percentiles. Timers wrap the methods from outside; nothing in the engine changes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from backend.engine.core import Engine, EngineConfig
from backend.engine.sampling_params import SamplingParams
from backend.engine.scheduler import Scheduler
from backend.executor.cpu.block_linear import BlockWeight
from backend.executor.model.model import LlamaModel
from backend.loading.model_cache import pull

Seconds = dict[str, float]


class StepClock:
    """Seconds spent per part, accumulated into whichever phase is current."""

    def __init__(self) -> None:
        self.phase = "burst"
        self.parts: dict[str, Seconds] = defaultdict(lambda: defaultdict(float))
        self.steps: dict[str, int] = defaultdict(int)

    def add(self, part: str, seconds: float) -> None:
        self.parts[self.phase][part] += seconds

    def wrap(self, owner: Any, name: str, part: Callable[..., str]) -> None:
        """Time `owner.name` under the part that `part(*args)` names."""
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.add(part(*args), time.perf_counter() - start)

        setattr(owner, name, timed)


def gemm_part(weight: BlockWeight, x: torch.Tensor, *args: Any) -> str:
    rows = x.numel() // weight.shape[1]
    return "block GEMM (>8 rows)" if rows > 8 else "block products (1-8 rows)"


def instrument(engine: Engine, clock: StepClock) -> None:
    clock.wrap(BlockWeight, "linear", gemm_part)
    clock.wrap(LlamaModel, "compute_logits", lambda *a: "logits")
    attention = engine.runner.model.ops.attention
    clock.wrap(attention, "attend", lambda *a: "attention")
    clock.wrap(attention, "write_kv", lambda *a: "attention")
    clock.wrap(engine.runner, "run", lambda *a: "model step")
    clock.wrap(engine, "sampler", lambda *a: "sampling")
    clock.wrap(Scheduler, "schedule", lambda *a: "scheduling")
    step = engine.step

    def counted_step() -> bool:
        start = time.perf_counter()
        ran = step()
        if ran:
            clock.steps[clock.phase] += 1
            clock.add("whole step", time.perf_counter() - start)
        return ran

    engine.step = counted_step  # type: ignore[method-assign]


def report(clock: StepClock, phase: str) -> None:
    parts = clock.parts[phase]
    whole = parts.get("whole step", 0.0)
    if not whole:
        return
    inside_model = ("block GEMM (>8 rows)", "block products (1-8 rows)", "attention", "logits")
    rest = parts["model step"] - sum(parts.get(p, 0.0) for p in inside_model)
    rows = [*((p, parts.get(p, 0.0)) for p in inside_model), ("other model ops", rest),
            ("sampling", parts.get("sampling", 0.0)), ("scheduling", parts.get("scheduling", 0.0)),
            ("engine outside these", whole - parts["model step"] - parts.get("sampling", 0.0)
             - parts.get("scheduling", 0.0))]
    print(f"{phase}: {clock.steps[phase]} steps, {whole:.2f} s")
    for name, seconds in rows:
        print(f"  {name:28s} {seconds:7.2f} s  {100 * seconds / whole:5.1f}%")


@contextmanager
def phase(clock: StepClock, name: str) -> Iterator[None]:
    previous, clock.phase = clock.phase, name
    try:
        yield
    finally:
        clock.phase = previous


def single_prefill(engine: Engine, clock: StepClock, prompts: list[list[int]], repeats: int) -> None:
    """Each prompt new to the prefix cache, so that the whole prompt is computed."""
    wholes, gemms = [], []
    for i in range(repeats + 1):  # the first warms up
        with phase(clock, f"single-{i}"):
            engine.generate_offline([prompts[i]], SamplingParams(max_tokens=1, ignore_eos=True))
        if i:
            wholes.append(1000 * clock.parts[f"single-{i}"]["whole step"])
            gemms.append(1000 * clock.parts[f"single-{i}"]["block GEMM (>8 rows)"])
    print(f"one {len(prompts[0])}-token prompt's prefill step: median {statistics.median(wholes):.1f} ms "
          f"(block GEMM {statistics.median(gemms):.1f} ms), of {repeats}: "
          f"{', '.join(f'{w:.0f}' for w in wholes)} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="a .gguf path or a model-cache name")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5, help="single-prompt prefills timed")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    path = Path(args.model) if args.model.endswith(".gguf") else pull(args.model, quiet=True)
    engine = Engine(EngineConfig(model_path=path, threads=args.threads,
                                 max_num_batched_tokens=args.max_num_batched_tokens))
    clock = StepClock()
    instrument(engine, clock)
    rng = random.Random(args.seed)
    vocab = engine.tokenizer.vocab_size
    def random_prompts(n: int) -> list[list[int]]:
        return [[rng.randrange(1000, vocab) for _ in range(args.input_len)] for _ in range(n)]

    single_prefill(engine, clock, random_prompts(args.repeats + 1), args.repeats)
    prompts = random_prompts(args.num_requests)

    first_tokens: list[float] = []
    burst_done = [False]
    step = engine.step

    def phased_step() -> bool:
        ran = step()
        if not burst_done[0] and not engine.scheduler.waiting and all(
            s.num_computed_tokens >= s.num_prompt_tokens for s in engine.scheduler.running
        ):
            burst_done[0] = True
            clock.phase = "after the last first token"
        return ran

    engine.step = phased_step  # type: ignore[method-assign]
    clock.phase = "burst (until the last first token)"
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0.0)
    started = time.monotonic()
    results = engine.generate_offline(prompts, params)
    for r in results:
        assert r.timings.first_token is not None
        first_tokens.append(r.timings.first_token - started)
    first_tokens.sort()
    p95 = first_tokens[min(len(first_tokens) - 1, round(0.95 * (len(first_tokens) - 1)))]
    print(f"burst of {args.num_requests} x {args.input_len} in / {args.output_len} out, "
          f"max_num_batched_tokens {args.max_num_batched_tokens}: TTFT median {statistics.median(first_tokens):.2f} s, "
          f"P95 {p95:.2f} s, max {first_tokens[-1]:.2f} s")
    for name in ("burst (until the last first token)", "after the last first token"):
        report(clock, name)


if __name__ == "__main__":
    main()
