"""The model with its fused Triton kernels (norms with residual adds, rotary, SiLU-and-mul) and TritonAttention
gives the torch path's logits and greedy tokens: tiny Llama and Qwen2 models under the interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backend.executor.model.ops import triton_ops
from backend.loading.loader import load_model
from tests.backend.model_harness import paged_greedy, prefill_logits
from tests.backend.tiny_models import tiny_config, tiny_hf_model, write_gguf

PROMPT = [3, 17, 200, 42, 42, 9, 120, 77, 5, 31, 64, 8, 150, 2, 99, 11, 13, 250]


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_fused_model_matches_torch_path(tmp_path: Path, model_type: str, device: torch.device) -> None:
    config = tiny_config(model_type)
    path = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(config, seed=3).state_dict(), config)
    reference = load_model(path).model
    fused = load_model(path, device=str(device), ops=triton_ops()).model
    assert fused.rotary.cos_sin_cache.device.type == device.type

    expected = prefill_logits(reference, PROMPT)
    got = prefill_logits(fused, PROMPT).cpu()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # Prefill then decodes over scattered blocks: the decode path of every kernel.
    assert paged_greedy(fused, PROMPT, 6) == paged_greedy(reference, PROMPT, 6)
