"""Tiny random checkpoints of every architecture the backend serves, built by transformers from each family's
own config class, saved as an HF folder, and converted to GGUF by the product's converter
(backend/loading/gguf/writer.py: names, layout and metadata as llama.cpp's convert_hf_to_gguf writes them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from backend.executor.model.config import ModelConfig
from backend.loading.gguf.writer import gguf_tensors, uniform, write_gguf
from tests.backend.tiny_models import BYTE_VOCAB, tiny_hf_model, write_hf_folder

SIZES: dict[str, Any] = dict(
    vocab_size=257, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
    bos_token_id=None, eos_token_id=256, pad_token_id=None,
)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16, "rope_theta": 500000.0}
# Phi-3 LongRoPE: served up to the original context with the short factors.
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.25 * i for i in range(8)], "long_factor": [2.0 + i for i in range(8)]}


@dataclass(slots=True)
class Family:
    """How to build one family's tiny model."""

    name: str
    config: Callable[[], Any]
    architecture: str  # the backend's name for it


# Gemma: small caps and window, so that every feature changes the tiny model's output.
_GEMMA = {**SIZES, "tie_word_embeddings": True, "query_pre_attn_scalar": 16, "sliding_window": 8,
          "attn_implementation": "eager"}


def _configs() -> list[Family]:
    from transformers import (
        Gemma2Config,
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        MixtralConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
        Qwen3MoeConfig,
    )

    return [
        Family("llama3", lambda: LlamaConfig(**SIZES, rope_parameters=dict(LLAMA3_ROPE)), "llama"),
        Family("mistral", lambda: MistralConfig(**{**SIZES, "sliding_window": 128}), "llama"),
        Family("qwen2", lambda: Qwen2Config(**SIZES), "qwen2"),
        Family("qwen3", lambda: Qwen3Config(**SIZES), "qwen3"),
        Family("phi3", lambda: Phi3Config(**{**SIZES, "max_position_embeddings": 1024},
                                          original_max_position_embeddings=256, sliding_window=200,
                                          rope_parameters=dict(LONGROPE)), "phi3"),
        Family("gemma2", lambda: Gemma2Config(**_GEMMA, attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
               "gemma2"),
        Family("gemma3", lambda: Gemma3TextConfig(**{**_GEMMA, "num_hidden_layers": 6}, rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}), "gemma3"),
        Family("qwen3moe", lambda: Qwen3MoeConfig(**SIZES, num_experts=4, num_experts_per_tok=2,
                                                  moe_intermediate_size=32, norm_topk_prob=True), "qwen3moe"),
        Family("mixtral", lambda: MixtralConfig(**{**SIZES, "intermediate_size": 32}, num_local_experts=8,
                                                num_experts_per_tok=2), "mixtral"),
    ]


FAMILIES = {f.name: f for f in _configs()}


# Sizes whose every matrix has rows of whole 256-value super-blocks (K-quants): hidden 256, 16 heads of 16.
K_QUANT_SIZES = {"hidden_size": 256, "num_attention_heads": 16, "intermediate_size": 256, "moe_intermediate_size": 256}


def build(family: Family, folder: Path, seed: int = 0, sizes: dict[str, int] | None = None) -> Any:
    """The transformers model, saved with a byte-level tokenizer in `folder`; `sizes` replaces those of the
    family's configuration that it has."""
    config = family.config()
    for key, value in (sizes or {}).items():
        if hasattr(config, key):
            setattr(config, key, value)
    model = tiny_hf_model(config, seed=seed)
    write_hf_folder(model, folder)
    return model


def q4_k_m(name: str) -> Q:
    """A Q4_K_M-like mix: Q6_K for the head and for V and the down projection of even layers (llama.cpp picks
    some layers so), Q4_K elsewhere; layer 0's merged QKV thus mixes two kinds."""
    if name == "output.weight":
        return Q.Q6_K
    layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
    return Q.Q6_K if name.endswith(("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight")) and layer % 2 == 0 \
        else Q.Q4_K


def write_family_gguf(family: Family, model: Any, path: Path, qtype: Q | Callable[[str], Q] = Q.F32, *,
                      per_expert: bool = False) -> Path:
    """`model` through the product's converter: every matrix in `qtype` (or the type it names for the tensor),
    norms, the embedding and the router F32. `per_expert`: one tensor per expert (`ffn_gate.3.weight`), as
    llama.cpp wrote Mixtral before it stacked them."""
    raw = model.config.to_dict()
    config = ModelConfig.from_hf_config(raw)
    assert config.architecture == family.architecture
    tensors = gguf_tensors(config, model.state_dict().items())
    matrices = uniform(qtype) if isinstance(qtype, Q) else lambda name, shape: uniform(qtype(name))(name, shape)
    return write_gguf(path, raw, BYTE_VOCAB, _one_per_expert(tensors) if per_expert else tensors,
                      lambda name, shape: Q.F32 if name == "token_embd.weight" else matrices(name, shape))


def _one_per_expert(tensors: Iterable[tuple[str, np.ndarray]]) -> Iterator[tuple[str, np.ndarray]]:
    for name, w in tensors:
        if "_exps." in name:
            yield from ((name.replace("_exps.", f".{e}."), matrix) for e, matrix in enumerate(w))
        else:
            yield name, w


def hf_greedy(model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy continuation, recomputing the whole sequence each step (no cache to differ)."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(new_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]
