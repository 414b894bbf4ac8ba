"""What each fused kernel buys over the torch reference ops (the CPU path's), at Llama-3-8B shapes."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from backend.executor import kernels
from backend.executor.cpu import elementwise
from backend.executor.model import rotary
from benchmarks.gpu.decode import LLAMA3_8B
from benchmarks.gpu.timing import cuda_time_ms


def _pair(torch_fn: Callable[[], object], fused_fn: Callable[[], object]) -> tuple[float, float]:
    return cuda_time_ms(torch_fn, iters=50), cuda_time_ms(fused_fn, iters=50)


def run(token_counts: tuple[int, ...] = (1, 128, 4096)) -> list[dict]:
    """One row per (op, tokens): torch composite time, fused kernel time, speedup."""
    cfg = LLAMA3_8B
    dev, bf16 = "cuda", torch.bfloat16
    norm_weight, eps = torch.ones(cfg.hidden_size, dtype=bf16, device=dev), cfg.rms_norm_eps
    cos_sin = rotary.build_cos_sin_cache(rotary.rope_inv_freq(cfg), cfg.max_position_embeddings).to(dev)
    rows = []
    for t in token_counts:
        x = torch.randn(t, cfg.hidden_size, dtype=bf16, device=dev)
        r = torch.randn_like(x)
        gate_up = torch.randn(t, 2 * cfg.intermediate_size, dtype=bf16, device=dev)
        qk = torch.randn(t, cfg.num_heads + cfg.num_kv_heads, cfg.head_dim, dtype=bf16, device=dev)
        positions = torch.randint(0, cfg.max_position_embeddings, (t,), device=dev)

        candidates: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
            "add_rms_norm": (
                partial(elementwise.add_rms_norm, x, r, norm_weight, eps),
                partial(kernels.add_rms_norm, x, r, norm_weight, eps),
            ),
            "silu_and_mul": (partial(elementwise.silu_and_mul, gate_up), partial(kernels.silu_and_mul, gate_up)),
            "rotary": (
                partial(rotary.rotate, positions, qk, cfg.num_heads, cos_sin),
                partial(kernels.rotate, positions, qk, cfg.num_heads, cos_sin),
            ),
        }
        for op, (torch_fn, fused_fn) in candidates.items():
            row: dict[str, object] = {"op": op, "tokens": t}
            try:
                torch_ms, fused_ms = _pair(torch_fn, fused_fn)
                row.update(torch_ms=round(torch_ms, 4), fused_ms=round(fused_ms, 4), speedup=round(torch_ms / fused_ms, 2))
            except Exception as exc:  # one failing op must not hide the others
                row["error"] = repr(exc)[:300]
            rows.append(row)
    return rows
