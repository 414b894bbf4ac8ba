"""The shape of a Llama-family model, read from GGUF metadata or an HF `config.json`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")

# HF `model_type` / `architectures` spellings mapped onto our architecture names.
_HF_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}


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

    def __post_init__(self) -> None:
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
        return cls(
            architecture=arch,
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
            max_position_embeddings=int(key("context_length", 2048)),
            tie_word_embeddings=tied,
            attention_bias=arch == "qwen2",
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
        theta = float(rope.pop("rope_theta", raw.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
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
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", arch == "qwen2")),
        )


def _gguf_rope_scaling(meta: dict[str, Any], arch: str) -> dict | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if kind in (None, "none") or not factor:
        return None
    if kind != "linear":
        raise UnsupportedModelError(f"unsupported RoPE scaling {kind!r} in GGUF metadata")
    return {"rope_type": "linear", "factor": float(factor)}
