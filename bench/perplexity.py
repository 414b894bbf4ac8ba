"""Perplexity of each `--quantization` mode on a fixed text, and greedy agreement of `auto` with `none`.

    python -m bench.perplexity [--model smollm2] [--modes none,auto,int8,int4] [--threads 1] [--json PATH]

The text (bench/data/perplexity.txt, about 800 tokens) is public domain: the Gettysburg Address, the opening
of the Declaration of Independence, the Preamble and the First Amendment of the US Constitution. It is scored
in one sequence over a paged cache twice: in chunks of 128 tokens, as the engine prefills it, and one token a
step, as decode steps run (the block kernel multiplies 1 to 8 rows otherwise than more: engine.md). Then twelve
varied prompts are decoded greedily for 48 tokens by an engine in each mode, one prompt at a time as at one
stream; the report counts how many outputs of each mode equal those of `none`. A mode `auto:ACT` is `auto`
with its blocks' decode products set to ACT (float32, int16 or int8: backend/executor/cpu/block_linear.py); a
suffix `@KV` sets the KV cache dtype (float32, float16, bfloat16; without it, the engine's default). The
reference, first, is always `none@float32`: float weights over an exact cache.

    python -m bench.perplexity --modes auto@float32,auto@float16,auto@bfloat16   # the KV cache's cost alone
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from backend.engine.core import Engine, EngineConfig
from backend.engine.sampling_params import SamplingParams
from backend.executor.attention.base import AttentionMetadata
from backend.executor.cpu.block_linear import BlockWeight
from backend.executor.model.model import LlamaModel
from backend.executor.model.vocabulary import Vocabulary
from backend.loading.loader import LoadedModel, load_model
from backend.loading.model_cache import resolve

TEXT = Path(__file__).parent / "data" / "perplexity.txt"
CHUNKS = {"prefill": 128, "decode": 1}  # tokens a forward pass scores
BLOCK = 16
GREEDY_TOKENS = 48
PROMPTS = [
    "The largest planet in the solar system is",
    "def binary_search(items, target):",
    "It was a dark and stormy night, and the lighthouse keeper",
    "2, 4, 8, 16, 32,",
    "Translate to Spanish: Where is the train station?",
    "La capitale de l'Italie est",
    "Three tips for better sleep:\n1.",
    "The mitochondria is the powerhouse of",
    "SELECT name, email FROM users WHERE",
    "Q: What is 12 times 12?\nA:",
    "Dear hiring manager, I am writing to apply for",
    "The quick brown fox",
]


def load_mode(path: Path, mode: str) -> LoadedModel:
    """The model under `--quantization` MODE, or for `auto:ACT` under auto with ACT decode activations."""
    quantization, _, activations = mode.partition(":")
    loaded = load_model(path, quantization=quantization)
    if activations:
        for module in loaded.model.modules():
            for value in vars(module).values():
                weight = value.table if isinstance(value, Vocabulary) else value
                if isinstance(weight, BlockWeight):
                    weight.decode_activations = activations
    return loaded


REFERENCE = "none@float32"


def engine_config(model_path: Path, mode: str) -> EngineConfig:
    """The one-stream engine a mode's greedy outputs come from, with the mode's KV cache dtype."""
    kv = mode.partition("@")[2] or "auto"
    return EngineConfig(model_path, kv_cache_memory=32 << 20, max_num_seqs=1, kv_cache_dtype=kv)


def perplexity(model: LlamaModel, ids: list[int], chunk: int, kv_dtype: torch.dtype) -> float:
    """exp(mean negative log-likelihood) of each token after the first, given all tokens before it, scored
    `chunk` tokens a forward pass over a cache of `kv_dtype`."""
    cfg = model.config
    blocks = -(-len(ids) // BLOCK)
    shape = (blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim)
    caches = [(torch.zeros(shape, dtype=kv_dtype), torch.zeros(shape, dtype=kv_dtype)) for _ in range(cfg.num_layers)]
    table = torch.arange(blocks, dtype=torch.int32).view(1, blocks)
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, chunk):
        tokens = ids[start : min(start + chunk, len(ids) - 1)]
        end = start + len(tokens)
        meta = AttentionMetadata(
            query_start_loc=torch.tensor([0, len(tokens)], dtype=torch.int32),
            context_lens=torch.tensor([end], dtype=torch.int32),
            block_tables=table,
            slot_mapping=torch.arange(start, end),  # blocks in order: a position is its slot
            max_query_len=len(tokens),
            max_context_len=end,
        )
        plan = model.ops.attention.plan(meta, BLOCK, kv_dtype)
        hidden = model(torch.tensor(tokens), torch.arange(start, end), caches, plan)
        logprobs = torch.log_softmax(model.compute_logits(hidden), dim=-1)
        targets = torch.tensor(ids[start + 1 : end + 1])
        nll -= float(logprobs.gather(1, targets.unsqueeze(1)).sum())
        count += len(tokens)
    return math.exp(nll / count)


def greedy_outputs(loaded: LoadedModel, config: EngineConfig) -> list[list[int]]:
    tok = loaded.tokenizer
    prompts = [tok.encode(p) for p in PROMPTS]
    params = SamplingParams(max_tokens=GREEDY_TOKENS, min_tokens=GREEDY_TOKENS, temperature=0.0)
    engine = Engine(config, loaded=loaded)
    try:
        return [c.token_ids for c in engine.generate_offline(prompts, params)]
    finally:
        engine.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.perplexity", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="a .gguf file, an HF folder or a named model")
    parser.add_argument("--modes", default="none,auto,int8,int4",
                        help="comma-separated MODE[:ACT][@KV] (auto:int8 sets auto's decode activations, @float16 "
                        "the KV cache dtype); none@float32 comes first")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_path = resolve(args.model)
    modes = [REFERENCE, *(m for m in args.modes.split(",") if m != REFERENCE)]
    rows: list[dict[str, object]] = []
    reference: list[list[int]] = []
    for mode in modes:
        started = time.perf_counter()
        config = engine_config(model_path, mode)
        loaded = load_mode(model_path, mode.partition("@")[0])
        ids = loaded.tokenizer.encode(TEXT.read_text())
        kv_dtype = config.kv_torch_dtype()
        scores = {way: perplexity(loaded.model, ids, chunk, kv_dtype) for way, chunk in CHUNKS.items()}
        outputs = greedy_outputs(loaded, config)
        reference = reference or outputs
        same = sum(a == b for a, b in zip(outputs, reference, strict=True))
        rows.append({"mode": mode, "tokens": len(ids), "perplexity": scores["prefill"],
                     "decode_perplexity": scores["decode"], "greedy_equal_to_none": same,
                     "prompts": len(PROMPTS), "seconds": round(time.perf_counter() - started, 1)})
        del loaded
    base, decode_base = float(rows[0]["perplexity"]), float(rows[0]["decode_perplexity"])  # type: ignore[arg-type]
    print(f"| mode | perplexity (prefill) | vs none | perplexity (decode) | vs none | "
          f"greedy {GREEDY_TOKENS}-token outputs equal to none |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        ppl, decode = float(row["perplexity"]), float(row["decode_perplexity"])  # type: ignore[arg-type]
        row["relative_to_none"], row["decode_relative_to_none"] = ppl / base - 1, decode / decode_base - 1
        print(f"| {row['mode']} | {ppl:.4f} | {100 * (ppl / base - 1):+.2f}% | {decode:.4f} | "
              f"{100 * (decode / decode_base - 1):+.2f}% | {row['greedy_equal_to_none']} of {row['prompts']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
