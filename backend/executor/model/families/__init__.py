"""One model class per architecture: `FAMILIES[config.architecture]` builds it (see docs/models.md)."""

from __future__ import annotations

from backend.executor.model.families.gemma import Gemma2Model, Gemma3Model
from backend.executor.model.families.mixtral import MixtralModel
from backend.executor.model.families.phi3 import Phi3Model
from backend.executor.model.families.qwen import Qwen2Model, Qwen3Model, Qwen3MoeModel
from backend.executor.model.model import LlamaModel

FAMILIES: dict[str, type[LlamaModel]] = {
    "llama": LlamaModel,  # Llama 1-3.x, SmolLM2, Mistral dense
    "qwen2": Qwen2Model,
    "qwen3": Qwen3Model,
    "phi3": Phi3Model,
    "gemma2": Gemma2Model,
    "gemma3": Gemma3Model,
    "qwen3moe": Qwen3MoeModel,
    "mixtral": MixtralModel,  # a llama-arch GGUF with experts
}
