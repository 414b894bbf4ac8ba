"""Phases of benchmarks/gpu/check.sh, each run in its own process (so a hung phase cannot eat the others' time),
and the report that joins their JSON files into one table and one JSON document.

    python -m benchmarks.gpu.check kernels|micro|decode|throughput --out DIR
    python -m benchmarks.gpu.check report --out DIR --json FILE
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

PHASES = ("kernels", "micro", "decode", "throughput")


def _kernels() -> dict:
    # One pytest process per test file, all at once: compiling the kernel variants dominates, and it is
    # single-threaded per process, so the files compile side by side on the machine's cores.
    env = dict(os.environ, TIDEGATE_KERNEL_DEVICE="cuda")
    files = sorted(str(p) for p in Path("tests/backend/executor/kernels").glob("test_*.py"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pytest", f, "-q", "-p", "no:cacheprovider"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for f in files
    ]
    summaries, failed, passed = [], [], True
    for f, proc in zip(files, procs, strict=True):
        out, _ = proc.communicate()
        print(f"--- {f}\n{out[-3000:]}")
        lines = out.strip().splitlines()
        summaries.append(f"{Path(f).name}: {lines[-1] if lines else 'no output'}")
        failed += [line.removeprefix("FAILED ") for line in lines if line.startswith("FAILED ")]
        passed = passed and proc.returncode == 0
    return {"passed": passed, "summary": "; ".join(summaries), "failed": failed}


def _micro() -> dict:
    import torch

    from benchmarks.gpu import fusions as gpu_fusions
    from benchmarks.gpu.timing import copy_bandwidth_gbps

    return {
        "device": torch.cuda.get_device_name(),
        "copy_gbps": round(copy_bandwidth_gbps(), 1),
        "fusions": gpu_fusions.run(),
    }


def _decode(out: Path) -> dict:
    from benchmarks.gpu import decode as gpu_decode

    micro = out / "micro.json"
    copy = json.loads(micro.read_text()).get("copy_gbps") if micro.exists() else None
    return {"rows": gpu_decode.run(copy_gbps=copy)}


def _throughput(model: Path) -> dict:
    from benchmarks.gpu import throughput as gpu_throughput

    if not model.exists():
        return {"skipped": f"model not found at {model}; pass --model or set TIDEGATE_GPU_CHECK_MODEL"}
    return gpu_throughput.run(model, cap_s=float(os.environ.get("TIDEGATE_GPU_CHECK_CAP", "55")))


def _default_model() -> Path:
    from backend.loading.model_cache import cached_path

    env = os.environ.get("TIDEGATE_GPU_CHECK_MODEL")
    return Path(env).expanduser() if env else cached_path("smollm2")


def _table(results: dict) -> str:
    lines = [f"# GPU check on {results.get('micro', {}).get('device', 'unknown GPU')}"]
    for phase in PHASES:
        if phase not in results:
            lines.append(f"{phase}: no result (failed or timed out; see the log above)")
    if "kernels" in results:
        k = results["kernels"]
        lines.append(f"kernels vs torch reference on GPU: {'PASS' if k['passed'] else 'FAIL'} ({k['summary']})")
        lines += [f"  failed: {name}" for name in k.get("failed", [])]
    micro = results.get("micro", {})
    if micro:
        lines.append(f"measured copy bandwidth: {micro['copy_gbps']} GB/s")
        lines.append("| fused op | tokens | torch ms | fused ms | speedup |")
        for r in micro["fusions"]:
            if "error" in r:
                lines.append(f"| {r['op']} | {r['tokens']} | failed: {r['error']} | | |")
                continue
            lines.append(f"| {r['op']} | {r['tokens']} | {r['torch_ms']} | {r['fused_ms']} | {r['speedup']}x |")
    decode_rows = results.get("decode", {}).get("rows", [])
    if decode_rows:
        lines.append(
            "| 8B decode batch | ctx | triton step ms | torch step ms | ratio | attn layer ratio "
            "| weight GB/s | of copy | graph step ms | graph of copy |"
        )
    for row in decode_rows:
        lines.append(
            f"| {row['batch']} | {row['context']} | {row['triton_step_ms']} | {row['torch_step_ms']} | "
            f"{row['torch_over_triton']}x | {row['attention_torch_over_triton']}x | {row['weight_gbps']} | "
            f"{row.get('weight_fraction_of_copy', '-')} | {row.get('graph_step_ms') or '-'} | "
            f"{row.get('graph_weight_fraction_of_copy', '-')} |"
        )
        for key, error in row.items():
            if key.endswith("_error"):
                lines.append(f"  batch {row['batch']} {key.removesuffix('_error')} failed: {error}")
    tp = results.get("throughput", {})
    if "skipped" in tp:
        lines.append(f"SmolLM2 throughput: skipped ({tp['skipped']})")
    elif tp:
        for name in ("triton", "torch"):
            r = tp[name]
            if "error" in r:
                lines.append(f"SmolLM2 {name}: failed: {r['error']}")
                continue
            done = "completed" if r["completed"] else "capped"
            lines.append(
                f"SmolLM2 {name}: {r['output_tokens_per_s']} output tok/s "
                f"({r['output_tokens']} tokens, {r['seconds']} s, {done})"
            )
        lines.append(f"SmolLM2 triton over torch: {tp['triton_over_torch']}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.check")
    parser.add_argument("phase", choices=(*PHASES, "report"))
    parser.add_argument("--out", type=Path, required=True, help="folder for each phase's JSON")
    parser.add_argument("--json", type=Path, help="report: where to write the joined JSON")
    parser.add_argument("--model", type=Path, help="SmolLM2 file (default: TIDEGATE_GPU_CHECK_MODEL or the cache)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.phase == "report":
        parts = [(p, args.out / f"{p}.json") for p in PHASES]
        results = {p: json.loads(path.read_text()) for p, path in parts if path.exists()}
        print(_table(results))
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return 0 if results.get("kernels", {}).get("passed") else 1
    runners = {
        "kernels": _kernels,
        "micro": _micro,
        "decode": lambda: _decode(args.out),
        "throughput": lambda: _throughput(args.model or _default_model()),
    }
    result = runners[args.phase]()
    (args.out / f"{args.phase}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
