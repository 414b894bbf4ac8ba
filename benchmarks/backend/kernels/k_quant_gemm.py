"""The K-quant prefill GEMM: GMAC/s of one many-row product (the wide path: more than 16 activation rows) at the
Llama-3.2-1B FFN shapes, per kind and thread count.

    .venv/bin/python -m benchmarks.backend.kernels.k_quant_gemm [--rows 512] [--threads 1,2]
        [--kinds Q4_K,Q6_K] [--shapes 8192x2048,2048x8192] [--repeats 5] [--peak 235]

Each product is timed `--repeats` times after one warm-up and the fastest kept (the weights are random bytes
with finite float16 scales: the kernel's work does not depend on the values). For context it prints the share
of `--peak`, the GMAC/s per core of a loop of nothing but independent 512-bit vpdpbusd: 235 on the Zen 4 the
figures in docs/benchmarks.md come from, where each zmm float op beside 8 dpbusd (a 32-value block of 16
output rows and one activation row) costs about a dpbusd's slot (8 dpbusd + 4 FMAs: 154 GMAC/s).
"""

from __future__ import annotations

import argparse
import time
from types import ModuleType

import numpy as np
import torch

from backend.executor.cpu import block_kernel
from backend.executor.cpu.k_quants import from_k_blocks
from backend.executor.cpu.quant_blocks import BlockQuantized
from benchmarks.backend.kernels.k_quant_decode import random_matrix


def gmacs(kind: str, out: int, inputs: int, rows: int, repeats: int, kernel: ModuleType) -> tuple[float, float]:
    """(the fastest product's ms, its GMAC/s)."""
    blocks = random_matrix(kind, out, inputs, np.random.default_rng(0))
    assert isinstance(blocks, BlockQuantized)
    weight = from_k_blocks(blocks, kernel)
    x = torch.randn(rows, inputs)
    weight.linear(x)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        weight.linear(x)
        best = min(best, time.perf_counter() - start)
    return 1e3 * best, rows * out * inputs / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=512, help="activation rows (a prefill chunk's tokens)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--kinds", default="Q4_K,Q6_K")
    parser.add_argument("--shapes", default="8192x2048,2048x8192", help="out x in, each a multiple of 256 in")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--peak", type=float, default=235.0, help="GMAC/s per core of a pure vpdpbusd loop")
    args = parser.parse_args()
    kernel = block_kernel.load()
    assert kernel is not None, "the CPU kernels do not build here"
    print(f"K-quant GEMM, {args.rows} rows, {kernel.k_isa()}, peak {args.peak:.0f} GMAC/s a core")
    for threads in (int(n) for n in args.threads.split(",")):
        torch.set_num_threads(threads)
        for kind in args.kinds.split(","):
            for shape in args.shapes.split(","):
                out, inputs = (int(n) for n in shape.split("x"))
                ms, rate = gmacs(kind, out, inputs, args.rows, args.repeats, kernel)
                share = 100 * rate / (args.peak * threads)
                print(f"  {kind} {out}x{inputs}, {threads} thread(s): {ms:.1f} ms, {rate:.0f} GMAC/s ({share:.0f}% of peak)")


if __name__ == "__main__":
    main()
