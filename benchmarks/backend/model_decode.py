"""Batch-1 decode step of our torch model against transformers', same GGUF, same threads, same run.

    .venv/bin/python -m benchmarks.backend.model_decode --context 256 --steps 64 --threads 2

Both models decode one token at a time after the same prompt; rounds alternate between them so that load
from other work on the machine falls on both alike. Reports median and p90 wall time per step and the median
CPU time per step (process CPU time, all threads).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from backend.executor.attention.base import AttentionMetadata
from backend.executor.model.layer import DecoderLayer
from backend.executor.model.model import LlamaModel
from backend.loading.loader import load_model
from backend.loading.model_cache import pull

BLOCK = 16


class OurDecoder:
    """One sequence in a paged cache, fed one token per step."""

    def __init__(self, model: LlamaModel, prompt: list[int], max_len: int) -> None:
        cfg = model.config
        self.model = model
        num_blocks = -(-max_len // BLOCK) + 1
        shape = (num_blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim)
        self.caches = [
            (torch.zeros(shape, dtype=model.dtype), torch.zeros(shape, dtype=model.dtype)) for _ in range(cfg.num_layers)
        ]
        self.table = torch.arange(1, num_blocks, dtype=torch.int32)[None, :]
        self.pos = 0
        self.step(prompt)

    def step(self, tokens: list[int]) -> int:
        n, start = len(tokens), self.pos
        positions = torch.arange(start, start + n)
        slots = (self.table[0, positions // BLOCK].long() * BLOCK + positions % BLOCK).long()
        meta = AttentionMetadata(
            query_start_loc=torch.tensor([0, n], dtype=torch.int32),
            context_lens=torch.tensor([start + n], dtype=torch.int32),
            block_tables=self.table,
            slot_mapping=slots,
            max_query_len=n,
            max_context_len=start + n,
        )
        plan = self.model.ops.attention.plan(meta, BLOCK, self.model.dtype)
        hidden = self.model(torch.tensor(tokens), positions, self.caches, plan)
        self.pos += n
        return int(self.model.compute_logits(hidden[-1:]).argmax(-1))


class HFDecoder:
    """transformers' model with its dynamic KV cache, fed one token per step."""

    def __init__(self, model: Any, prompt: list[int]) -> None:
        self.model = model
        with torch.inference_mode():
            out = model(torch.tensor([prompt]), use_cache=True)
        self.past = out.past_key_values

    def step(self, tokens: list[int]) -> int:
        with torch.inference_mode():
            out = self.model(torch.tensor([tokens]), past_key_values=self.past, use_cache=True)
        self.past = out.past_key_values
        return int(out.logits[0, -1].argmax())


def timed(decoder: Any, token: int, steps: int) -> tuple[list[float], list[float], int]:
    wall, cpu = [], []
    for _ in range(steps):
        w, c = time.perf_counter(), time.process_time()
        token = decoder.step([token])
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return wall, cpu, token


def matvec_floor(model: LlamaModel, rounds: int = 10) -> float:
    """CPU seconds for one pass of 1-row products over every weight matrix: the floor of a decode step."""
    matrices = [model.packed_head if model.packed_head is not None else model.lm_head]
    for layer in model.layers:
        assert isinstance(layer, DecoderLayer)
        matrices += [layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj]
    inputs = {w.shape[1]: torch.randn(1, w.shape[1], dtype=model.dtype) for w in matrices}
    with torch.inference_mode():
        start = time.process_time()
        for _ in range(rounds):
            for w in matrices:
                model.ops.linear(inputs[w.shape[1]], w)
    return (time.process_time() - start) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=256, help="prompt length before decoding")
    parser.add_argument("--steps", type=int, default=64, help="decode steps per model, in rounds of 8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="our model's dtype")
    parser.add_argument("--model", type=Path, default=None, help="GGUF path (default: SmolLM2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = args.model or pull("smollm2", quiet=True)

    from transformers import AutoModelForCausalLM

    ours_model = load_model(path, dtype=getattr(torch, args.dtype)).model
    hf_model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    prompt = [int(t) for t in torch.randint(100, 40000, (args.context,), generator=torch.Generator().manual_seed(0))]
    ours = OurDecoder(ours_model, prompt, args.context + args.steps + 16)
    hf = HFDecoder(hf_model, prompt)
    results: dict[str, tuple[list[float], list[float]]] = {"tidegate": ([], []), "transformers": ([], [])}
    tokens = {"tidegate": 1, "transformers": 1}
    for _ in range(max(1, args.steps // 8)):
        for name, dec in (("tidegate", ours), ("transformers", hf)):
            wall, cpu, tokens[name] = timed(dec, tokens[name], 8)
            results[name][0].extend(wall)
            results[name][1].extend(cpu)
    floor = matvec_floor(ours_model)
    print(f"batch-1 decode, context {args.context}, {args.threads} threads, ours in {args.dtype}, {len(results['tidegate'][0])} steps each")
    print(f"{'model':<14}{'median ms':>10}{'p90 ms':>10}{'cpu ms':>10}")
    for name, (wall, cpu) in results.items():
        p90 = statistics.quantiles(wall, n=10)[-1]
        print(f"{name:<14}{1000 * statistics.median(wall):>10.1f}{1000 * p90:>10.1f}{1000 * statistics.median(cpu):>10.1f}")
    print(f"matrix-vector products alone over our weights: {1000 * floor:.1f} cpu ms per step")


if __name__ == "__main__":
    main()
