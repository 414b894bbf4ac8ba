"""The fixed cost of one K-quant decode product: a one-row product with a single group of 8 output rows, so that
the weights cost next to nothing and what is timed is the call, the activation row's quantization and the
reduction of its halves.

    .venv/bin/python -m benchmarks.backend.kernels.k_quant_fixed_cost [--inputs 2048,8192] [--calls 200]

A decode step of Llama-3.2-1B makes ~70 such products (of 2048- and 8192-value rows) besides the head, each
paying this once on one thread while the others wait. Reports the median microseconds a call, at 16-bit
activations (the default for decode rows: two int8 rows) and 8-bit ones, on one thread.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from backend.executor.cpu import block_kernel
from backend.executor.cpu.block_linear import KINDS

Q4_K_SUPER_BYTES = 32 + 8 * (128 + 16)  # a group's super-block: header, then 8 blocks (csrc/k_blocks.h)


def one_group(inputs: int) -> torch.Tensor:
    """A Q4_K group of 8 rows in the kernel's layout: random quants, zero float16 scales (finite)."""
    supers = inputs // 256
    data = torch.randint(0, 256, (1, supers, Q4_K_SUPER_BYTES), dtype=torch.uint8)
    data[..., :32] = 0  # the header: d and dmin of the 8 rows
    return data.reshape(1, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", default="2048,8192", help="row lengths (multiples of 256)")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    kernel = block_kernel.load()
    assert kernel is not None, "the CPU kernels do not build here"
    torch.set_num_threads(1)
    print(f"K-quant decode product, one group of 8 rows, 1 thread, {kernel.k_isa()}")
    for inputs in (int(n) for n in args.inputs.split(",")):
        data, x = one_group(inputs), torch.randn(1, inputs)
        for bits in (16, 8):
            times = []
            for _ in range(args.calls):
                start = time.perf_counter()
                kernel.k_linear(x, data, KINDS["Q4_K"], bits, 8)
                times.append(time.perf_counter() - start)
            print(f"  {inputs}-value row, {bits}-bit activations: {1e6 * statistics.median(times):.1f} us a call")


if __name__ == "__main__":
    main()
