"""`load_model`: a GGUF file or a Hugging Face folder in, a ready model and tokenizer out."""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from backend.executor.cpu.quant_blocks import Weight
from backend.executor.model import quantized_linear
from backend.executor.model.config import ModelConfig, UnsupportedModelError
from backend.executor.model.families import FAMILIES
from backend.executor.model.model import LlamaModel
from backend.executor.model.ops import ModelOps
from backend.loading.gguf.weights import read_gguf
from backend.loading.safetensors_weights import read_hf_folder
from backend.loading.tokenizer import Tokenizer


@dataclass(slots=True)
class LoadedModel:
    config: ModelConfig
    model: LlamaModel
    tokenizer: Tokenizer


def load_model(
    path: Path,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    ops: ModelOps | None = None,
    quantization: str = "none",
) -> LoadedModel:
    """Load a `.gguf` file or an HF folder (`config.json` + `*.safetensors` + `tokenizer.json`) onto `device`.

    The model runs `ops`, by default those `backend.executor.model.ops.ops_for(device, dtype)` picks (Triton on CUDA,
    torch elsewhere). `quantization` (auto, none, int8, int4) keeps matrices quantized on CPU, as
    `backend.executor.model.quantized_linear.form_for` says; elsewhere, and where torch lacks the kernels, they
    stay float.

    Raises FileNotFoundError for a missing path and UnsupportedModelError (a ValueError) naming what is not
    supported: architecture, tensor type, tokenizer model.
    """
    path = Path(path).expanduser()
    if device != "cpu" or not quantized_linear.available():
        quantization = "none"  # the quantized products are CPU kernels; the GPU path stays dense
    if not path.exists():
        raise FileNotFoundError(f"model not found: {path}")
    freq_factors = None
    weights: dict[str, Weight]
    if path.is_dir():
        config, weights = read_hf_folder(path)
        tokenizer = Tokenizer.from_hf_folder(path, max_context=config.max_position_embeddings)
    elif path.suffix == ".gguf":
        contents = read_gguf(path, keep_blocks=quantization != "none")
        config, weights, freq_factors = contents.config, contents.weights, contents.rope_freq_factors
        tokenizer = Tokenizer.from_gguf_metadata(contents.metadata, max_context=config.max_position_embeddings)
        del contents
    else:
        raise UnsupportedModelError(f"{path.name}: expected a .gguf file or a folder with config.json")
    with torch.device(device):  # built where it runs: the weights are copied there once, as they load
        model = FAMILIES[config.architecture](config, dtype=dtype, ops=ops, rope_freq_factors=freq_factors)
    model.load_weights(HandedOver(weights), quantization)
    model.eval()
    return LoadedModel(config=config, model=model, tokenizer=tokenizer)


class HandedOver(Mapping[str, Weight]):
    """Weights given away whole: iterating their items takes each one out of the dict, so that the model holds
    the only reference and the file's form of a matrix is freed as soon as its own is built (not both forms of
    every matrix at once: 800 MiB more at the end of Llama-3.2-1B Q4_K_M's load)."""

    def __init__(self, weights: dict[str, Weight]) -> None:
        self._weights = weights

    def __getitem__(self, name: str) -> Weight:
        return self._weights[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._weights)

    def __len__(self) -> int:
        return len(self._weights)

    def items(self) -> ItemsView[str, Weight]:
        return _TakenItems(self._weights)


class _TakenItems(ItemsView[str, Weight]):
    def __init__(self, weights: dict[str, Weight]) -> None:
        super().__init__(weights)
        self._weights = weights

    def __iter__(self) -> Iterator[tuple[str, Weight]]:
        for name in list(self._weights):
            yield name, self._weights.pop(name)
