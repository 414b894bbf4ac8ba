"""The block kernel's product of many rows (a prefill chunk) with GGML's 32-value kinds: GMAC/s per kind, shape,
activation mode and thread count, beside torch's float32 matmul (oneDNN) of the same shape in the same run.

    .venv/bin/python -m benchmarks.backend.kernels.block_gemm [--rows 256,1024] [--threads 1,2]
        [--kinds Q5_0,Q8_0] [--shapes 4864x896,896x896] [--activations float32,int16] [--seconds 3]

The weights are random normal values quantized by the `gguf` package. `float32` is the exact path (blocks
dequantized into a float32 GEMM), `int16` the default (an integer GEMM on AVX-512 VNNI; on AVX2 more than 8 rows
take the exact path too, so the two modes time the same code there). torch's matmul of the dequantized float32
matrix runs oneDNN's kernels: what the CPU's float32 arithmetic gives on the same threads, the reference. Each
product is called for `--seconds` after a warm-up and its fastest call kept: on a shared 2-core VM the median of a
product drifts by a sixth within minutes, its fastest call far less.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from backend.executor.cpu import block_kernel
from backend.executor.cpu.block_linear import ACTIVATION_BITS, from_blocks
from backend.executor.cpu.quant_blocks import BlockQuantized


def fastest(seconds: float, product: Callable[..., Any], *args: Any) -> float:
    """The fastest of as many calls `product(*args)` as fit `seconds` (after one warm-up), in seconds."""
    product(*args)
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        began = time.perf_counter()
        product(*args)
        best = min(best, time.perf_counter() - began)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="256,1024", help="activation rows (a prefill chunk's tokens)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--kinds", default="Q5_0,Q8_0")
    parser.add_argument("--shapes", default="4864x896,896x896", help="out x in (in a multiple of 32)")
    parser.add_argument("--activations", default="float32,int16", help=f"modes among {', '.join(ACTIVATION_BITS)}")
    parser.add_argument("--seconds", type=float, default=3.0, help="calls per product, as time")
    args = parser.parse_args()
    kernel = block_kernel.load()
    assert kernel is not None, "the CPU kernels do not build here"
    modes = args.activations.split(",")
    print(f"block GEMM, AVX2 path: {kernel.uses_avx2()}, AVX-512 VNNI GEMM: {kernel.uses_avx512_vnni()}; "
          "GMAC/s of the fastest call")
    for kind in args.kinds.split(","):
        for shape in args.shapes.split(","):
            out, inputs = (int(n) for n in shape.split("x"))
            values = np.random.default_rng(0).normal(0, 0.05, (out, inputs)).astype(np.float32)
            raw = quantize(values, GGMLQuantizationType[kind])
            blocks = BlockQuantized(kind, torch.from_numpy(raw), (out, inputs))
            dense = torch.from_numpy(dequantize(raw, GGMLQuantizationType[kind])).contiguous()
            weights = {mode: from_blocks(blocks, kernel, mode) for mode in modes}
            for threads in (int(n) for n in args.threads.split(",")):
                torch.set_num_threads(threads)
                for rows in (int(n) for n in args.rows.split(",")):
                    x = torch.randn(rows, inputs)
                    macs = rows * out * inputs / 1e9
                    reference = macs / fastest(args.seconds, torch.matmul, x, dense.T)
                    cells = [f"{mode} {macs / fastest(args.seconds, w.linear, x):.1f}" for mode, w in weights.items()]
                    print(f"  {kind} {out}x{inputs}, {rows} rows, {threads} thread(s): {'  '.join(cells)}  "
                          f"(torch float32 matmul {reference:.1f})", flush=True)


if __name__ == "__main__":
    main()
