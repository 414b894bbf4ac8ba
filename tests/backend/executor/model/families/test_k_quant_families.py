"""Every family loads a K-quant GGUF (a Q4_K_M-like mix of Q4_K and Q6_K, and whole Q5_K and Q6_K files) into the
file's own super-blocks under `--quantization auto`, and its logits stay near those of the same file dequantized
to float32; the C++ decode stack, where the family runs it, gives the Python loop's tokens."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from backend.executor.cpu import block_kernel
from backend.executor.cpu.block_linear import BlockWeight
from backend.executor.model.quantized_linear import StackedWeight
from backend.loading.loader import load_model
from tests.backend.family_models import FAMILIES, K_QUANT_SIZES, build, q4_k_m, write_family_gguf
from tests.backend.model_harness import paged_greedy, prefill_logits

PROMPTS = [[72, 101, 108, 108, 111], [100, 101, 102, 32, 102, 40, 120, 41, 58] * 3]
# Products with int8 activations per 32 values against the float product of the same dequantized weights: every
# logit of these tiny random models (hidden 256) within this fraction of the reference's largest |logit| (the
# largest gaps seen: 1.2-1.4% for the Llama, Qwen, Phi-3 and MoE families, 2.3% for Gemma 2, 0.9% for Gemma 3).
K_QUANT_RTOL = 0.04
SCHEMES: dict[str, Q | Callable[[str], Q]] = {"Q4_K_M": q4_k_m, "Q5_K": Q.Q5_K, "Q6_K": Q.Q6_K}
CASES = [(family, "Q4_K_M") for family in sorted(FAMILIES)] + [("qwen2", "Q5_K"), ("llama3", "Q6_K")]

pytestmark = pytest.mark.skipif(block_kernel.load() is None, reason="the block kernel does not build here")


@pytest.mark.parametrize(("name", "scheme"), CASES)
def test_k_quant_gguf_computes_natively_near_its_dequantized_weights(name: str, scheme: str, tmp_path: Path) -> None:
    spec = FAMILIES[name]
    model = build(spec, tmp_path / "hf", sizes=K_QUANT_SIZES)
    path = write_family_gguf(spec, model, tmp_path / f"{scheme}.gguf", SCHEMES[scheme])
    native = load_model(path, quantization="auto")
    dequantized = load_model(path)
    matrices = [getattr(module, name) for module in native.model.layers.modules()
                for name in getattr(module, "MATRICES", ())]
    kinds = {m.kind if isinstance(m, BlockWeight) else "+".join(p.kind for p in m.parts) for m in matrices
             if isinstance(m, BlockWeight | StackedWeight)}
    assert all(isinstance(m, BlockWeight | StackedWeight) for m in matrices), "every matrix stays in blocks"
    expected = {"Q4_K_M": {"Q4_K", "Q6_K", "Q4_K+Q6_K"}, "Q5_K": {"Q5_K"}, "Q6_K": {"Q6_K"}}[scheme]
    assert kinds <= expected and kinds
    for prompt in PROMPTS:
        reference = prefill_logits(dequantized.model, prompt)
        torch.testing.assert_close(prefill_logits(native.model, prompt), reference, rtol=0,
                                   atol=K_QUANT_RTOL * float(reference.abs().max()))
    if native.model.fused is not None:  # the C++ decode stack, stacked parts included, runs the loop's kernels
        fused = [paged_greedy(native.model, p, 6) for p in PROMPTS]
        native.model.fused = None
        assert [paged_greedy(native.model, p, 6) for p in PROMPTS] == fused
