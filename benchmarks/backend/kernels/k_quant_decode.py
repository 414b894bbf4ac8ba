"""Decode-step time and resident weight size of one model shape with its matrices in each GGUF type.

    .venv/bin/python -m benchmarks.backend.kernels.k_quant_decode [--layers 8 --hidden 1024 --intermediate 4864] [--threads 1]

Builds a Llama-shaped model with random weights (the matrices' bytes random with fixed finite scales: a product
costs the same whatever the values), once per type: float32 (packed for oneDNN as `none` runs it), Q4_1 (the
32-value block kernel) and Q4_K, Q5_K, Q6_K (the K-quant kernel), all under `--quantization auto`. Reports the
median milliseconds of a batch-1 decode step (the model's forward and logits over a paged cache, as
benchmarks/backend/decode_step.py runs it) and the MiB the layers' matrices hold. The hidden size must be a multiple of
256 for the K-quants: Qwen2.5-0.5B's 896 is not (llama.cpp writes those matrices in other types), so the default
is 1024 beside its intermediate 4864. The vocabulary is small (float32, tied, the same for every type), so the figures
are the layers'.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from backend.executor.cpu.block_linear import BlockWeight
from backend.executor.cpu.quant_blocks import BLOCK_BYTES, BLOCK_VALUES, BlockQuantized, Weight
from backend.executor.model.config import ModelConfig
from backend.executor.model.layer import DecoderLayer
from backend.executor.model.model import LlamaModel
from backend.executor.model.quantized_linear import StackedWeight
from benchmarks.backend.decode_step import median_ms, step_fn

TYPES = ("float32", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
# Where each type keeps its float16 scales (byte offsets in a block): finite values, so no product meets NaN.
_SCALES = {"Q4_1": (0, 4), "Q4_K": (0, 4), "Q5_K": (0, 4), "Q6_K": (208, 210)}


def random_matrix(kind: str, rows: int, cols: int, rng: np.random.Generator) -> Weight:
    if kind == "float32":
        return torch.from_numpy(rng.standard_normal((rows, cols), dtype=np.float32) * 0.02)
    data = rng.integers(0, 256, size=(rows, cols // BLOCK_VALUES[kind], BLOCK_BYTES[kind]), dtype=np.uint8)
    start, end = _SCALES[kind]
    data[..., start:end] = np.resize(np.array([0.001, -0.0005], dtype=np.float16).view(np.uint8), end - start)
    return BlockQuantized(kind, torch.from_numpy(data.reshape(rows, -1)), (rows, cols))


def build(kind: str, config: ModelConfig, seed: int = 0) -> LlamaModel:
    rng = np.random.default_rng(seed)
    h, i, q, kv = config.hidden_size, config.intermediate_size, config.num_heads * config.head_dim, \
        config.num_kv_heads * config.head_dim
    weights: dict[str, Weight] = {
        "model.embed_tokens.weight": torch.randn(config.vocab_size, h) * 0.02,
        "model.norm.weight": torch.ones(h),
    }
    for layer in range(config.num_layers):
        prefix = f"model.layers.{layer}."
        for name, shape in (("self_attn.q_proj", (q, h)), ("self_attn.k_proj", (kv, h)), ("self_attn.v_proj", (kv, h)),
                            ("self_attn.o_proj", (h, q)), ("mlp.gate_proj", (i, h)), ("mlp.up_proj", (i, h)),
                            ("mlp.down_proj", (h, i))):
            weights[prefix + name + ".weight"] = random_matrix(kind, *shape, rng)
        weights[prefix + "input_layernorm.weight"] = torch.ones(h)
        weights[prefix + "post_attention_layernorm.weight"] = torch.ones(h)
    model = LlamaModel(config)
    model.load_weights(weights, "auto")
    return model


def matrix_mib(model: LlamaModel) -> float:
    total = 0
    for layer in model.layers:
        assert isinstance(layer, DecoderLayer)
        for name in layer.MATRICES:
            m = getattr(layer, name)
            parts = m.parts if isinstance(m, StackedWeight) else [m]
            for p in parts:
                if isinstance(p, BlockWeight):
                    total += p.quants.nbytes + p.scales.nbytes + (0 if p.mins is None else p.mins.nbytes)
                else:
                    total += p.numel() * p.element_size()  # oneDNN's packed float32 holds as many values
    return total / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=4864)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--types", default=",".join(TYPES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = ModelConfig("llama", args.vocab, args.hidden, args.intermediate, args.layers, args.heads, args.kv_heads,
                         args.hidden // args.heads, 1e-5, 10000.0, None, 4096, True, False)
    print(f"{args.layers} layers, hidden {args.hidden}, intermediate {args.intermediate}, {args.heads}/{args.kv_heads}"
          f" heads, {args.threads} thread(s), context {args.context}, batch 1")
    print(f"{'type':>8} {'ms/token':>9} {'CPU ms':>7} {'weights MiB':>12} {'load s':>7}")
    for kind in args.types.split(","):
        started = time.perf_counter()
        model = build(kind, config)
        loaded = time.perf_counter() - started
        with torch.inference_mode():
            wall, cpu = median_ms(step_fn(model, 1, args.context), args.runs)
        print(f"{kind:>8} {wall:9.2f} {cpu:7.2f} {matrix_mib(model):12.1f} {loaded:7.1f}", flush=True)
        del model


if __name__ == "__main__":
    main()
