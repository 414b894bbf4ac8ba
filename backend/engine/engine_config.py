"""The engine's configuration: the backend's engine settings and the model file they apply to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from backend.executor.model.config import ModelConfig
from backend.executor.runner import kv_block_bytes
from config.backend import EngineSettings

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class EngineConfig(EngineSettings):
    """`config.EngineSettings` (the one definition of every engine field and default) plus the model path."""

    model_path: Path

    def __init__(self, model_path: Path | str | None = None, /, **fields: Any) -> None:
        # The model path may also come first, positionally: it is the one field without a default.
        if model_path is not None:
            fields["model_path"] = model_path
        super().__init__(**fields)

    @classmethod
    def for_model(cls, settings: EngineSettings, model_path: Path) -> EngineConfig:
        """The engine part of a replica's settings (a BackendSettings is one), for one model file."""
        return cls(model_path, **settings.model_dump(include=set(EngineSettings.model_fields)))

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.float32 if self.device == "cpu" else torch.bfloat16
        return _DTYPES[self.dtype]

    def kv_blocks(self, model: ModelConfig) -> int:
        """The KV pool's blocks: kv_cache_tokens rounded up to whole blocks, else what kv_cache_memory holds."""
        if self.kv_cache_tokens is not None:
            return max(2, -(-self.kv_cache_tokens // self.block_size))
        blocks = int(self.kv_cache_memory) // kv_block_bytes(model, self.block_size, self.kv_torch_dtype())
        if blocks < 2:
            raise ValueError(f"kv_cache_memory={self.kv_cache_memory} bytes holds fewer than 2 KV blocks")
        return blocks

    def kv_torch_dtype(self) -> torch.dtype:
        # float16 as llama.cpp's default cache: half the memory and the bytes a decode step reads, and the
        # greedy answers of a float32 cache on the models tested (docs/engine.md); the CPU kernels widen it.
        if self.kv_cache_dtype == "auto":
            weights = self.torch_dtype()
            return torch.float16 if self.device == "cpu" and weights == torch.float32 else weights
        return _DTYPES[self.kv_cache_dtype]
