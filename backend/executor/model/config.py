"""The shape of a Llama-family model, read from GGUF metadata or an HF `config.json`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Each has its model class in backend/executor/model/families/ (FAMILIES there is keyed by these names).
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "qwen3moe", "mixtral")

# HF `model_type` / `architectures` spellings mapped onto our architecture names.
_HF_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
                   "gemma2": "gemma2", "gemma3_text": "gemma3",
                   "qwen3_moe": "qwen3moe", "mixtral": "mixtral"}
# GGUF architectures whose files with experts (`{arch}.expert_count`) are another family: llama.cpp writes
# Mixtral as a llama file.
_GGUF_EXPERT_FAMILIES = {"llama": "mixtral"}


class UnsupportedModelError(ValueError):
    """The file describes an architecture, tensor type or tokenizer this backend cannot run."""


@dataclass(slots=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only Llama-family transformer."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    # Attention of the configured window (Mistral, Phi-3): the context is capped at it, so full attention is it;
    # unless `sliding_window_layers` names the windowed layers (Gemma), whose attention masks to the window.
    sliding_window: int | None = None
    sliding_window_layers: tuple[bool, ...] | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    query_pre_attn_scalar: float | None = None  # attention scale is its -1/2 power (head_dim's if None)
    rope_local_theta: float | None = None  # RoPE base of the windowed layers, unscaled (Gemma 3)
    num_experts: int = 0  # mixture of experts: every layer's MLP is `num_experts_used` of these, routed
    num_experts_used: int = 0
    expert_intermediate_size: int = 0
    norm_topk_prob: bool = False  # the chosen experts' weights renormalized to sum to 1

    def __post_init__(self) -> None:
        windowed = self.sliding_window_layers is not None
        if self.sliding_window and self.sliding_window < self.max_position_embeddings and not windowed:
            self.max_position_embeddings = self.sliding_window
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported architecture {self.architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_heads ({self.num_heads}) is not a multiple of num_kv_heads ({self.num_kv_heads})"
            )

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any], *, vocab_size: int, tied: bool) -> ModelConfig:
        """Build from GGUF key/values (`{arch}.block_count` ...); `vocab_size` and `tied` come from the tensors."""
        arch = str(meta.get("general.architecture", ""))
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )

        def key(name: str, default: Any = None) -> Any:
            value = meta.get(f"{arch}.{name}", default)
            if value is None:
                raise UnsupportedModelError(f"GGUF metadata lacks {arch}.{name}")
            return value

        hidden = int(key("embedding_length"))
        heads = int(key("attention.head_count"))
        head_dim = int(meta.get(f"{arch}.attention.key_length") or meta.get(f"{arch}.rope.dimension_count") or 0)
        extra = _gemma_gguf(meta, arch, hidden // heads, head_dim) if arch.startswith("gemma") else {}
        family = arch
        if meta.get(f"{arch}.expert_count"):
            family = _GGUF_EXPERT_FAMILIES.get(arch, arch)
            # Mixtral's files give no expert size: its feed_forward_length is the experts'.
            ffn = meta.get(f"{arch}.expert_feed_forward_length") or key("feed_forward_length")
            extra = {"num_experts": int(key("expert_count")), "num_experts_used": int(key("expert_used_count")),
                     "expert_intermediate_size": int(ffn),
                     "norm_topk_prob": bool(meta.get(f"{arch}.expert_weights_norm", True))}  # llama.cpp's default
        return cls(
            architecture=family,
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=int(key("feed_forward_length")),
            num_layers=int(key("block_count")),
            num_heads=heads,
            num_kv_heads=int(key("attention.head_count_kv", heads)),
            head_dim=head_dim or hidden // heads,
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rope_scaling=_gguf_rope_scaling(meta, arch),
            max_position_embeddings=_gguf_context(meta, arch),
            tie_word_embeddings=tied,
            attention_bias=arch == "qwen2",
            sliding_window=int(meta.get(f"{arch}.attention.sliding_window") or 0) or None,
            **extra,
        )

    @classmethod
    def from_hf_config(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from a Hugging Face `config.json` (transformers 4 and 5 spellings of RoPE settings)."""
        model_type = str(raw.get("model_type", ""))
        arch = _HF_MODEL_TYPES.get(model_type)
        if arch is None:
            raise UnsupportedModelError(
                f"unsupported architecture {model_type!r}; supported: {', '.join(sorted(_HF_MODEL_TYPES))}"
            )
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        # transformers 5 folds rope_theta and rope_scaling into one `rope_parameters` dict.
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        extra = _gemma_hf(raw, rope) if arch.startswith("gemma") else _moe_hf(raw) if _experts(raw) else {}
        rope = dict(rope.get("full_attention", rope))  # Gemma 3: per layer kind; the local one is in `extra`
        theta = float(rope.pop("rope_theta", raw.get("rope_theta", 10000.0)))
        rope_type = str(rope.get("rope_type", rope.get("type", "default")))
        if float(rope.pop("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))) != 1.0:
            raise UnsupportedModelError("unsupported partial_rotary_factor (only whole-head RoPE is implemented)")
        if rope_type == "longrope":
            rope.setdefault("original_max_position_embeddings", raw.get("original_max_position_embeddings"))
            rope.setdefault("factor", int(raw["max_position_embeddings"]) / rope["original_max_position_embeddings"])
        return cls(
            architecture=arch,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=None if rope_type == "default" else {**rope, "rope_type": rope_type},
            max_position_embeddings=_hf_context(raw, rope_type, rope),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", arch == "qwen2")),
            sliding_window=_hf_sliding_window(raw),
            **extra,
        )


def _experts(raw: dict[str, Any]) -> int:
    # transformers 5 writes num_local_experts (Mixtral's name) where 4 wrote num_experts.
    return int(raw.get("num_experts") or raw.get("num_local_experts") or 0)


def _moe_hf(raw: dict[str, Any]) -> dict[str, Any]:
    if raw.get("mlp_only_layers") or int(raw.get("decoder_sparse_step", 1)) != 1:
        raise UnsupportedModelError("unsupported mixture of experts with dense layers (mlp_only_layers)")
    # Mixtral's config has neither key: its intermediate_size is the experts', and it always renormalizes.
    mixtral = raw["model_type"] == "mixtral"
    return {"num_experts": _experts(raw), "num_experts_used": int(raw["num_experts_per_tok"]),
            "expert_intermediate_size": int(raw.get("moe_intermediate_size") or raw["intermediate_size"]),
            "norm_topk_prob": bool(raw.get("norm_topk_prob", mixtral))}


def _gemma_hf(raw: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    if raw.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise UnsupportedModelError(f"unsupported hidden_activation {raw['hidden_activation']!r}")
    local = rope.get("sliding_attention", {}).get("rope_theta", raw.get("rope_local_base_freq"))
    # Configs from before transformers wrote layer_types: Gemma 2 alternates, Gemma 3 has a period.
    period = int(raw.get("sliding_window_pattern") or (2 if raw["model_type"] == "gemma2" else 6))
    kinds = raw.get("layer_types") or [
        "sliding_attention" if (i + 1) % period else "full_attention" for i in range(int(raw["num_hidden_layers"]))
    ]
    return {
        "sliding_window_layers": tuple(kind == "sliding_attention" for kind in kinds),
        "attn_logit_softcapping": raw.get("attn_logit_softcapping"),
        "final_logit_softcapping": raw.get("final_logit_softcapping"),
        "query_pre_attn_scalar": raw.get("query_pre_attn_scalar"),
        "rope_local_theta": float(local) if local is not None and raw["model_type"] == "gemma3_text" else None,
    }


def _gemma_gguf(meta: dict[str, Any], arch: str, hidden_per_head: int, head_dim: int) -> dict[str, Any]:
    # As llama.cpp: Gemma 2 alternates windowed and global layers, Gemma 3 has five windowed per global one,
    # its windowed layers on an unscaled base of 10000; the 27B models scale attention by hidden / heads.
    layers = int(meta[f"{arch}.block_count"])
    period = 2 if arch == "gemma2" else 6
    softcap = meta.get(f"{arch}.attn_logit_softcapping")
    final = meta.get(f"{arch}.final_logit_softcapping")
    return {
        "sliding_window_layers": tuple((i + 1) % period != 0 for i in range(layers)),
        "attn_logit_softcapping": float(softcap) if softcap else None,
        "final_logit_softcapping": float(final) if final else None,
        "query_pre_attn_scalar": float(hidden_per_head if layers in (46, 62) else head_dim),
        "rope_local_theta": 10000.0 if arch == "gemma3" else None,
    }


def _hf_sliding_window(raw: dict[str, Any]) -> int | None:
    # Qwen2/3 write a window but turn it off with use_sliding_window; Mistral and Phi-3 have no such switch.
    if not raw.get("use_sliding_window", True):
        return None
    return int(raw.get("sliding_window") or 0) or None


def _hf_context(raw: dict[str, Any], rope_type: str, rope: dict[str, Any]) -> int:
    # LongRoPE switches to its long factors past the original context: only the short ones are served.
    if rope_type == "longrope":
        return int(rope["original_max_position_embeddings"])
    return int(raw.get("max_position_embeddings", 2048))


def _gguf_context(meta: dict[str, Any], arch: str) -> int:
    # As _hf_context: a LongRoPE file (Phi-3 writes the original context) is served up to that context.
    original = meta.get(f"{arch}.rope.scaling.original_context_length")
    return int(original or meta.get(f"{arch}.context_length", 2048))


def _gguf_rope_scaling(meta: dict[str, Any], arch: str) -> dict | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    original = meta.get(f"{arch}.rope.scaling.original_context_length")
    if original and int(original) < int(meta.get(f"{arch}.context_length", 0)):
        # llama.cpp's Phi-3 LongRoPE: these keys, and the factors as rope_factors_{short,long} tensors.
        attn = meta.get(f"{arch}.rope.scaling.attn_factor")
        return {"rope_type": "longrope", "attention_factor": float(attn) if attn else None,
                "original_max_position_embeddings": int(original),
                "factor": int(meta[f"{arch}.context_length"]) / int(original)}
    if kind in (None, "none") or not factor:
        return None
    if kind != "linear":
        raise UnsupportedModelError(f"unsupported RoPE scaling {kind!r} in GGUF metadata")
    return {"rope_type": "linear", "factor": float(factor)}
