"""Compile every kernel for NVIDIA Hopper (sm_90) ahead of time, without a GPU.

The CPU interpreter runs kernels as Python, so it cannot catch what only the compiler rejects (types that
change across loop iterations, early returns, dot shapes). Triton can lower a kernel to a cubin with its
bundled ptxas and no driver. Run in a process where TRITON_INTERPRET is unset:
``python -m tests.backend.executor.kernels.gpu_compile``; prints one line per variant and exits 1 if any fails.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

HOPPER = GPUTarget("cuda", 90, 32)
# Scalar arguments that are not 32-bit integers; every other non-pointer argument is an i32.
_SCALARS = {"scale_log2": "fp32", "eps": "fp32", "stride_cache_block": "i64"}


def _signature(kernel: Any, pointers: dict[str, str], constexprs: dict[str, Any]) -> dict[str, str]:
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = pointers.get(name, pointers["*"])
        else:
            sig[name] = _SCALARS.get(name, "i32")
    return sig


def _variants() -> list[tuple[str, Any, dict[str, str], dict[str, Any]]]:
    attn = importlib.import_module("backend.executor.kernels.paged_attention")._paged_attention_kernel
    kv = importlib.import_module("backend.executor.kernels.kv_write")._kv_write_kernel
    norm = importlib.import_module("backend.executor.kernels.fused_norm")._rms_norm_kernel
    silu = importlib.import_module("backend.executor.kernels.activation")._silu_and_mul_kernel
    rotary = importlib.import_module("backend.executor.kernels.rotary")._rotary_kernel
    merge = importlib.import_module("backend.executor.kernels.paged_attention")._merge_splits_kernel
    ints = {
        "query_start_loc_ptr": "*i32", "context_lens_ptr": "*i32", "block_tables_ptr": "*i32",
        "partial_acc_ptr": "*fp32", "partial_ml_ptr": "*fp32",
    }

    def attention(
        dtype: str, group: int, group_pad: int, head_dim: int, block_q: int, split: bool = False
    ) -> dict[str, Any]:
        return {
            "GROUP": group, "GROUP_PAD": group_pad, "HEAD_DIM": head_dim, "BLOCK_D": head_dim,
            "BLOCK_Q": block_q, "BLOCK_N": 32, "PRECISION": "ieee" if dtype == "fp32" else "tf32",
            "DOT_FP32": False, "SPLIT_KV": split,
        }

    return [
        ("attention bf16 decode, Llama-3-8B heads", attn, {"*": "*bf16", **ints}, attention("bf16", 8, 8, 128, 2)),
        ("attention fp16 prefill, SmolLM2 heads", attn, {"*": "*fp16", **ints}, attention("fp16", 3, 4, 64, 16)),
        ("attention fp32 decode", attn, {"*": "*fp32", **ints}, attention("fp32", 1, 1, 64, 16)),
        ("attention bf16 split-context decode", attn, {"*": "*bf16", **ints}, attention("bf16", 8, 8, 128, 2, True)),
        ("merge of split contexts bf16", merge, {"*": "*bf16", **ints},
         {"HEAD_DIM": 128, "BLOCK_D": 128, "SPLITS_PAD": 8}),
        ("kv_write fp32 rows into bf16 cache", kv, {"*": "*bf16", "k_ptr": "*fp32", "v_ptr": "*fp32",
                                                   "slot_mapping_ptr": "*i64"}, {"HEAD_DIM": 128, "BLOCK_D": 128}),
        ("add_rms_norm bf16", norm, {"*": "*bf16"}, {"HAS_RESIDUAL": True, "BLOCK": 4096}),
        ("rms_norm fp16", norm, {"*": "*fp16"}, {"HAS_RESIDUAL": False, "BLOCK": 1024}),
        ("silu_and_mul bf16", silu, {"*": "*bf16"}, {"BLOCK": 1024}),
        ("rotary neox bf16", rotary, {"*": "*bf16", "positions_ptr": "*i64", "cos_sin_ptr": "*fp32"},
         {"HALF": 64, "HALF_PAD": 64, "Q_HEADS_PAD": 32, "K_HEADS_PAD": 8, "IS_NEOX": True}),
        ("rotary gpt-j fp16", rotary, {"*": "*fp16", "positions_ptr": "*i64", "cos_sin_ptr": "*fp32"},
         {"HALF": 32, "HALF_PAD": 32, "Q_HEADS_PAD": 16, "K_HEADS_PAD": 4, "IS_NEOX": False}),
    ]


def main() -> int:
    failed = 0
    for name, kernel, pointers, constexprs in _variants():
        if not isinstance(kernel, triton.runtime.JITFunction):
            print(f"FAIL {name}: kernels were decorated for the interpreter (TRITON_INTERPRET is set)")
            return 1
        try:
            compiled = triton.compile(ASTSource(kernel, _signature(kernel, pointers, constexprs), constexprs), HOPPER)
            print(f"OK   {name} (shared memory {compiled.metadata.shared} bytes)")
        except Exception as exc:
            failed += 1
            print(f"FAIL {name}: {exc!r}"[:4000])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
