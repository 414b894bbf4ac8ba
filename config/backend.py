"""Backend (inference replica) settings."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field

from config.gateway import Tracing


class BackendSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = "smollm2"  # a path to a .gguf file or an HF folder, or a name from the model cache
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=9001, ge=0, le=65535)
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"  # auto: float32 on CPU, bf16 on GPU
    max_num_seqs: int = Field(default=64, ge=1)
    max_num_batched_tokens: int = Field(default=1024, ge=16)
    max_model_len: int | None = Field(default=None, ge=16)
    block_size: int = Field(default=16, ge=1, le=256)
    kv_cache_memory: ByteSize = Field(default=ByteSize(512 * 1024 * 1024))
    enable_prefix_caching: bool = True
    cuda_graphs: bool = True  # replay captured decode steps on CUDA; false runs every step eagerly
    max_waiting: int = Field(default=256, ge=1)
    max_waiting_tokens: int = Field(default=262144, ge=1)
    queue_timeout: float = Field(default=30.0, gt=0)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    threads: int | None = Field(default=None, ge=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    tracing: Tracing = Field(default_factory=Tracing)  # spans per request; service name tidegate-backend
