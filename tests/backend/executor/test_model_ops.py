"""Each device gets its ops once, at build; the runner plans attention once per step; CPU never loads triton."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from backend import Engine, EngineConfig, SamplingParams
from backend.executor.attention.base import AttentionMetadata
from backend.executor.attention.torch_attention import TorchAttention, TorchAttentionPlan
from backend.executor.cpu import cpu_linear, elementwise, elementwise_kernel
from backend.executor.model import rotary
from backend.executor.model.ops import ops_for, torch_ops
from backend.loading.loader import load_model
from tests.backend.tiny_models import tiny_config, tiny_hf_model, write_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = tiny_config("llama")
    return write_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", tiny_hf_model(config).state_dict(), config)


class CountingAttention(TorchAttention):
    """The torch backend, counting the plans it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.plans = 0

    def plan(self, meta: AttentionMetadata, block_size: int, dtype: torch.dtype) -> TorchAttentionPlan:
        self.plans += 1
        return super().plan(meta, block_size, dtype)


def test_cpu_gets_packed_matrices_and_cpp_row_ops_only_in_float32() -> None:
    fp32, bf16 = ops_for("cpu", torch.float32), ops_for("cpu", torch.bfloat16)
    for ops in (fp32, bf16):
        assert isinstance(ops.attention, TorchAttention)
    assert bf16.linear is F.linear and bf16.pack is None
    torch_rows = (elementwise.rms_norm, elementwise.add_rms_norm, elementwise.silu_and_mul)
    assert (bf16.rms_norm, bf16.add_rms_norm, bf16.silu_and_mul) == torch_rows
    assert isinstance(bf16.rotary, rotary.StepRotation)
    if cpu_linear.available():
        assert fp32.linear is cpu_linear.linear and fp32.pack is cpu_linear.pack
    if elementwise_kernel.available():
        kernel = elementwise_kernel
        assert (fp32.rms_norm, fp32.add_rms_norm, fp32.silu_and_mul, fp32.rotary) == (
            kernel.rms_norm, kernel.add_rms_norm, kernel.silu_and_mul, kernel.rotate
        )


def test_each_model_has_its_own_attention_buffers_and_rotation_rows() -> None:
    # The torch backend keeps gather buffers and the step's rotation rows across calls: two models must not share them.
    for dtype in (torch.float32, torch.bfloat16):
        first, second = ops_for("cpu", dtype), ops_for("cpu", dtype)
        assert first.attention is not second.attention
        assert first.rotary is not second.rotary or not isinstance(first.rotary, rotary.StepRotation)


def test_the_runner_plans_attention_once_per_step(tiny_gguf: Path) -> None:
    attention = CountingAttention()
    loaded = load_model(tiny_gguf, ops=dataclasses.replace(torch_ops(), attention=attention))
    # one token per step, so that four tokens take four steps
    engine = Engine(EngineConfig(tiny_gguf, kv_cache_memory=4 << 20, speculative="none"), loaded=loaded)
    prompts = [[5, 9, 77, 3] * 5, [8, 1, 200]]
    completions = engine.generate_offline(prompts, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert [len(c.token_ids) for c in completions] == [4, 4]
    steps = engine.stats().steps
    assert steps >= 4 and attention.plans == steps  # not once per layer (the model has two)


def test_the_cpu_path_never_imports_triton(tiny_gguf: Path) -> None:
    script = (
        "import sys\n"
        "from backend import SamplingParams\n"
        "from backend import Engine, EngineConfig\n"
        f"engine = Engine(EngineConfig({str(tiny_gguf)!r}, kv_cache_memory=4 << 20))\n"
        "engine.generate_offline([[5, 9, 77]], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))\n"
        "print('triton loaded' if 'triton' in sys.modules else 'triton not loaded')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "triton not loaded"
