"""`load_model`: a GGUF file or a Hugging Face folder in, a ready model and tokenizer out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from backend.executor import cpu_linear
from backend.executor.attention import AttentionBackend, TorchAttention
from backend.executor.model import LlamaModel
from backend.executor.model_config import ModelConfig, UnsupportedModelError
from backend.loading.gguf_weights import read_gguf
from backend.loading.safetensors_weights import read_hf_folder
from backend.loading.tokenizer import Tokenizer


@dataclass(slots=True)
class LoadedModel:
    config: ModelConfig
    model: LlamaModel
    tokenizer: Tokenizer


def load_model(path: Path, *, device: str = "cpu", dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a `.gguf` file or an HF folder (`config.json` + `*.safetensors` + `tokenizer.json`).

    Raises FileNotFoundError for a missing path and UnsupportedModelError (a ValueError) naming what is not
    supported: architecture, tensor type, tokenizer model.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model not found: {path}")
    freq_factors = None
    if path.is_dir():
        config, weights = read_hf_folder(path)
        tokenizer = Tokenizer.from_hf_folder(path, max_context=config.max_position_embeddings)
    elif path.suffix == ".gguf":
        contents = read_gguf(path)
        config, weights, freq_factors = contents.config, contents.weights, contents.rope_freq_factors
        tokenizer = Tokenizer.from_gguf_metadata(contents.metadata, max_context=config.max_position_embeddings)
    else:
        raise UnsupportedModelError(f"{path.name}: expected a .gguf file or a folder with config.json")
    model = LlamaModel(config, dtype=dtype, attention=attention_for(device), rope_freq_factors=freq_factors)
    model.load_weights(weights)
    model.to(device)
    model.eval()
    if device.startswith("cuda"):
        model.use_fused_kernels()
    elif device == "cpu" and dtype == torch.float32 and cpu_linear.available():
        model.pack_weights()
    return LoadedModel(config=config, model=model, tokenizer=tokenizer)


def attention_for(device: str) -> AttentionBackend:
    """Triton kernels on CUDA; the torch reference everywhere else (and triton is then never imported)."""
    if device.startswith("cuda"):
        from backend.executor.kernels import TritonAttention

        return TritonAttention()
    return TorchAttention()
