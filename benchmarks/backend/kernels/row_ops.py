"""What each C++ row-wise op of a decoder layer costs on the CPU against the torch ops it replaces, per call, at
SmolLM2-135M's shapes (hidden 576, 9 query and 3 key-value heads of 64, intermediate 1536), float32.

    .venv/bin/python -m benchmarks.backend.kernels.row_ops --rows 1,8,32 --threads 1

Each figure is the best of five rounds of `--calls` calls, in process CPU microseconds per call (on a shared
machine CPU time is the steadier); torch and C++ alternate round by round, so both see the same load.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from backend.executor.attention.base import AttentionMetadata
from backend.executor.attention.torch_attention import TorchAttention
from backend.executor.cpu import elementwise, elementwise_kernel, paged_kernel
from backend.executor.model import rotary

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 576, 9, 3, 64, 1536
BLOCK, BLOCKS, CONTEXT = 16, 700, 300


def cpu_us(fn: Callable[[], object], calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn()
    return 1e6 * (time.process_time() - start) / calls


def pairs(rows: int) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """Per op: the torch reference's call and the C++ one, on fresh inputs of `rows` tokens."""
    x, residual, weight = torch.randn(rows, HIDDEN), torch.randn(rows, HIDDEN), torch.randn(HIDDEN)
    gate_up = torch.randn(rows, 2 * INTERMEDIATE)
    table = rotary.build_cos_sin_cache(1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM), 8192)
    positions = torch.randint(0, 8192, (rows,))
    qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
    qk = qkv[:, : (HEADS + KV_HEADS) * HEAD_DIM].view(rows, -1, HEAD_DIM)
    k = qk[:, HEADS:]
    v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM :].view(rows, KV_HEADS, HEAD_DIM)
    caches = torch.randn(BLOCKS, BLOCK, KV_HEADS, HEAD_DIM), torch.randn(BLOCKS, BLOCK, KV_HEADS, HEAD_DIM)
    meta = AttentionMetadata(
        torch.arange(rows + 1, dtype=torch.int32), torch.full((rows,), CONTEXT, dtype=torch.int32),
        torch.randint(0, BLOCKS, (rows, -(-CONTEXT // BLOCK)), dtype=torch.int32),
        torch.randperm(BLOCKS * BLOCK)[:rows], 1, CONTEXT,
    )
    sdpa, kernel = TorchAttention(use_kernel=False), TorchAttention()
    sdpa_plan, kernel_plan = sdpa.plan(meta, BLOCK, torch.float32), kernel.plan(meta, BLOCK, torch.float32)
    step_rotation = rotary.StepRotation()
    return {
        "add + rms_norm": (lambda: elementwise.add_rms_norm(x, residual, weight, 1e-5),
                           lambda: elementwise_kernel.add_rms_norm(x, residual, weight, 1e-5)),
        "silu_and_mul": (lambda: elementwise.silu_and_mul(gate_up), lambda: elementwise_kernel.silu_and_mul(gate_up)),
        "rotary": (lambda: step_rotation(positions, qk, HEADS, table),
                   lambda: elementwise_kernel.rotate(positions, qk, HEADS, table)),
        "write_kv": (lambda: sdpa.write_kv(k, v, *caches, sdpa_plan), lambda: kernel.write_kv(k, v, *caches, kernel_plan)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,32", help="tokens per call, a comma-separated list")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not (elementwise_kernel.available() and paged_kernel.available()):
        raise SystemExit("the C++ extension does not build here")
    print("| op | rows | torch us | C++ us |\n| --- | --- | --- | --- |")
    with torch.inference_mode():
        for rows in (int(r) for r in args.rows.split(",")):
            for name, (reference, ours) in pairs(rows).items():
                reference(), ours()
                rounds = [(cpu_us(reference, args.calls), cpu_us(ours, args.calls)) for _ in range(5)]
                print(f"| {name} | {rows} | {min(r[0] for r in rounds):.1f} | {min(r[1] for r in rounds):.1f} |")


if __name__ == "__main__":
    main()
