#!/usr/bin/env bash
# The GPU check of issue 8, for one NVIDIA GPU machine, in under 8 minutes:
#   1. every Triton kernel test, compiled for the GPU, against the torch reference;
#   2. copy bandwidth and what each fused kernel buys;
#   3. decode step time of a Llama-3-8B-shaped model (random bf16 weights) at batch 1, 16, 128,
#      Triton vs torch attention, with achieved weight bandwidth against the copy bandwidth;
#   4. SmolLM2 offline throughput on nano-vllm's workload, Triton vs torch attention.
# Usage: benchmarks/gpu/check.sh [RESULT.json]   (env: PYTHON, TIDEGATE_GPU_CHECK_MODEL, TIDEGATE_GPU_CHECK_CAP)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
RESULT=${1:-gpu_check.json}
OUT=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi not available"
# Per-phase wall limits (seconds); they sum to 470.
phase() { echo "== $1 (limit $2 s)"; timeout --kill-after=5 "$2" "$PY" -m benchmarks.gpu.check "$1" --out "$OUT" || echo "== $1 ended with status $?"; }
phase kernels 170
phase micro 30
phase decode 110
phase throughput 160
"$PY" -m benchmarks.gpu.check report --out "$OUT" --json "$RESULT"
status=$?
echo "JSON: $RESULT"
exit $status
