"""What each fused kernel buys over the torch ops the model runs today, at Llama-3-8B shapes."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from backend.executor.kernels import add_rms_norm, apply_rotary, build_cos_sin_cache, silu_and_mul
from backend.executor.model import RMSNorm, RotaryEmbedding, _rotate
from bench.experiments.gpu_decode import LLAMA3_8B
from bench.experiments.gpu_timing import cuda_time_ms


def _pair(torch_fn: Callable[[], object], fused_fn: Callable[[], object]) -> tuple[float, float]:
    return cuda_time_ms(torch_fn, iters=50), cuda_time_ms(fused_fn, iters=50)


def _torch_add_norm(norm: RMSNorm, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return norm(x + r)


def _torch_silu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _torch_rotary(rotary: RotaryEmbedding, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
    cos, sin = rotary(positions, q.dtype)
    _rotate(q, cos, sin)
    _rotate(k, cos, sin)


def run(token_counts: tuple[int, ...] = (1, 128, 4096)) -> list[dict]:
    """One row per (op, tokens): torch composite time, fused kernel time, speedup."""
    cfg = LLAMA3_8B
    dev, bf16 = "cuda", torch.bfloat16
    norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, bf16).to(dev)
    with torch.device(dev):  # its cos/sin tables are plain attributes, which .to() would not move
        rotary = RotaryEmbedding(cfg)
    cos_sin = build_cos_sin_cache(rotary.inv_freq, 8192)
    rows = []
    for t in token_counts:
        x = torch.randn(t, cfg.hidden_size, dtype=bf16, device=dev)
        r = torch.randn_like(x)
        gate_up = torch.randn(t, 2 * cfg.intermediate_size, dtype=bf16, device=dev)
        q = torch.randn(t, cfg.num_heads, cfg.head_dim, dtype=bf16, device=dev)
        k = torch.randn(t, cfg.num_kv_heads, cfg.head_dim, dtype=bf16, device=dev)
        # Below the model table's initial 4096 rows: growing it mixes CPU and GPU tensors (see docs/gpu.md).
        positions = torch.randint(0, 4096, (t,), device=dev)

        candidates: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
            "add_rms_norm": (partial(_torch_add_norm, norm, x, r), partial(add_rms_norm, x, r, norm.weight, norm.eps)),
            "silu_and_mul": (partial(_torch_silu, gate_up), partial(silu_and_mul, gate_up)),
            "rotary": (partial(_torch_rotary, rotary, positions, q, k), partial(apply_rotary, positions, q, k, cos_sin)),
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
