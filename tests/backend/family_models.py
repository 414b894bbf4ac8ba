"""Tiny random checkpoints of every architecture the backend serves, built by transformers from each family's
own config class, saved as an HF folder, and converted to GGUF here (tensor names and metadata as llama.cpp's
convert_hf_to_gguf writes them; F32, a type gguf.quants encodes, or a K-quant from tests/backend/k_quantizer.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

from tests.backend.k_quantizer import quantize_k
from tests.backend.tiny_models import (
    add_byte_tokenizer,
    add_shape,
    finish_gguf,
    tiny_hf_model,
    write_hf_folder,
)

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

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight", "mlp.experts.gate_proj.weight": "ffn_gate_exps.weight",
    "mlp.experts.up_proj.weight": "ffn_up_exps.weight", "mlp.experts.down_proj.weight": "ffn_down_exps.weight",
}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}


@dataclass(slots=True)
class Family:
    """How to build one family's tiny model and how llama.cpp writes it."""

    name: str
    gguf_arch: str
    config: Callable[[], Any]
    architecture: str = ""  # the backend's name for it, where the GGUF's differs (Mixtral is a llama file)
    permute_qk: bool = False  # llama-arch files: Q/K rows permuted for llama.cpp's RoPE
    metadata: Callable[[gguf.GGUFWriter, Any], None] | None = None
    extra_tensors: Callable[[Any], dict[str, np.ndarray]] | None = None
    names: dict[str, str] | None = None  # this family's GGUF names where they differ from Llama's
    norm_shift: float = 0.0  # what the converter adds to norm weights (Gemma: 1)

    def __post_init__(self) -> None:
        self.architecture = self.architecture or self.gguf_arch


def _llama3_factors(config: Any) -> dict[str, np.ndarray]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    base = 1.0 / (LLAMA3_ROPE["rope_theta"] ** (torch.arange(0, 16, 2).float() / 16))
    return {"rope_freqs.weight": (base / scaled).numpy().astype(np.float32)}


def _phi3_metadata(writer: gguf.GGUFWriter, config: Any) -> None:
    writer.add_rope_scaling_orig_ctx_len(config.original_max_position_embeddings)
    writer.add_sliding_window(config.sliding_window)


def _phi3_factors(config: Any) -> dict[str, np.ndarray]:
    return {f"rope_factors_{kind}.weight": np.array(LONGROPE[f"{kind}_factor"], dtype=np.float32)
            for kind in ("short", "long")}


_GEMMA_NAMES = {"post_attention_layernorm.weight": "post_attention_norm.weight",
                "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}
# Gemma: small caps and window, so that every feature changes the tiny model's output.
_GEMMA = {**SIZES, "tie_word_embeddings": True, "query_pre_attn_scalar": 16, "sliding_window": 8,
          "attn_implementation": "eager"}


def _gemma2_metadata(writer: gguf.GGUFWriter, config: Any) -> None:
    writer.add_sliding_window(config.sliding_window)
    writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
    writer.add_final_logit_softcapping(config.final_logit_softcapping)


def _gemma3_metadata(writer: gguf.GGUFWriter, config: Any) -> None:
    writer.add_sliding_window(config.sliding_window)


def _moe_metadata(writer: gguf.GGUFWriter, config: Any) -> None:
    writer.add_expert_count(config.num_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_expert_feed_forward_length(config.moe_intermediate_size)


def _mixtral_metadata(writer: gguf.GGUFWriter, config: Any) -> None:
    # llama.cpp writes no expert size for Mixtral: feed_forward_length is the experts'.
    writer.add_expert_count(config.num_local_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)


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
        Family("llama3", "llama", lambda: LlamaConfig(**SIZES, rope_parameters=dict(LLAMA3_ROPE)), permute_qk=True,
               extra_tensors=_llama3_factors),
        Family("mistral", "llama", lambda: MistralConfig(**{**SIZES, "sliding_window": 128}), permute_qk=True),
        Family("qwen2", "qwen2", lambda: Qwen2Config(**SIZES)),
        Family("qwen3", "qwen3", lambda: Qwen3Config(**SIZES)),
        Family("phi3", "phi3", lambda: Phi3Config(**{**SIZES, "max_position_embeddings": 1024},
                                                   original_max_position_embeddings=256, sliding_window=200,
                                                   rope_parameters=dict(LONGROPE)),
               metadata=_phi3_metadata, extra_tensors=_phi3_factors),
        Family("gemma2", "gemma2", lambda: Gemma2Config(**_GEMMA, attn_logit_softcapping=2.0,
                                                          final_logit_softcapping=3.0),
               metadata=_gemma2_metadata, names=_GEMMA_NAMES, norm_shift=1.0),
        Family("gemma3", "gemma3", lambda: Gemma3TextConfig(**{**_GEMMA, "num_hidden_layers": 6}, rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
               metadata=_gemma3_metadata, names=_GEMMA_NAMES, norm_shift=1.0),
        Family("qwen3moe", "qwen3moe", lambda: Qwen3MoeConfig(**SIZES, num_experts=4, num_experts_per_tok=2,
                                                            moe_intermediate_size=32, norm_topk_prob=True),
               metadata=_moe_metadata),
        Family("mixtral", "llama", lambda: MixtralConfig(**{**SIZES, "intermediate_size": 32}, num_local_experts=8,
                                                         num_experts_per_tok=2),
               architecture="mixtral", permute_qk=True, metadata=_mixtral_metadata),
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
    """`model` as llama.cpp would convert it; every matrix in `qtype` (or the type it names for the tensor), norms,
    the embedding and the router F32 (llama.cpp's quantize keeps `ffn_gate_inp` so). `per_expert`: one tensor per expert (`ffn_gate.3.weight`), as
    llama.cpp wrote Mixtral before it stacked them."""
    config = model.config
    writer = gguf.GGUFWriter(path, family.gguf_arch)
    add_shape(writer, config)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    rope = config.rope_parameters
    writer.add_rope_freq_base(float(rope.get("full_attention", rope)["rope_theta"]))
    if family.metadata is not None:
        family.metadata(writer, config)
    add_byte_tokenizer(writer)
    for hf_name, tensor in _split_experts(model.state_dict()).items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        name = _gguf_name(hf_name, family.names or {})
        w = tensor.detach().float().numpy()
        kind = qtype if isinstance(qtype, Q) else qtype(name)
        if per_expert and "_exps." in name:
            for e, matrix in enumerate(w):
                _add(writer, name.replace("_exps.", f".{e}."), matrix, kind)
            continue
        if name.endswith("norm.weight"):
            w = w + family.norm_shift
        if family.permute_qk and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_attention_heads if name.endswith("attn_q.weight") else config.num_key_value_heads
            w = w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        kept = w.ndim == 1 or name.endswith(("token_embd.weight", "ffn_gate_inp.weight"))
        _add(writer, name, w, Q.F32 if kept else kind)
    return finish_gguf(writer, path, family.extra_tensors(config) if family.extra_tensors else {})


def _add(writer: gguf.GGUFWriter, name: str, w: np.ndarray, qtype: Q) -> None:
    if qtype == Q.F32:
        writer.add_tensor(name, np.ascontiguousarray(w))
    elif qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        rows = quantize_k(w.reshape(-1, w.shape[-1]), qtype)
        writer.add_tensor(name, rows.reshape(*w.shape[:-1], -1), raw_dtype=qtype)
    else:
        writer.add_tensor(name, quantize(w, qtype), raw_dtype=qtype)


def _split_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers holds each layer's experts fused ([experts, 2 * ffn, hidden] gate|up); llama.cpp one tensor
    per kind."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            out[name[: -len("gate_up_proj")] + "gate_proj.weight"], out[name[: -len("gate_up_proj")] + "up_proj.weight"] = (
                tensor.chunk(2, dim=1))
        elif name.endswith("mlp.experts.down_proj"):
            out[name + ".weight"] = tensor
        else:
            out[name] = tensor
    return out


def _gguf_name(hf_name: str, names: dict[str, str]) -> str:
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{names.get(rest) or _LAYER[rest]}"


def hf_greedy(model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy continuation, recomputing the whole sequence each step (no cache to differ)."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(new_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]
