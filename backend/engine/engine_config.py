"""Engine settings: what the server derives from config.BackendSettings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(slots=True)
class EngineConfig:
    """Engine settings; the server builds it from config.BackendSettings."""

    model_path: Path
    device: str = "cpu"
    dtype: str = "auto"  # float32 on CPU, bfloat16 on GPU
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_memory: int = 512 * 1024 * 1024
    enable_prefix_caching: bool = True
    cuda_graphs: bool = True  # on CUDA with graph-safe attention: decode steps replay captured graphs
    max_waiting: int = 256
    max_waiting_tokens: int = 262144
    queue_timeout: float = 30.0
    threads: int | None = None

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.float32 if self.device == "cpu" else torch.bfloat16
        return _DTYPES[self.dtype]
