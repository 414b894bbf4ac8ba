"""The inference backend, in layers: server/ (OpenAI HTTP API) -> engine/ (loop, scheduler, paged KV cache,
output processing) -> executor/ (model runner, model, attention, sampler); loading/ builds what the engine runs.

The engine's public names are re-exported here lazily, so that light modules of this package (the model
cache, used by the CLI) do not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backend.engine.core import Engine
    from backend.engine.engine_config import EngineConfig
    from backend.engine.errors import EngineOverloaded, InvalidGenerateRequest, QueueTimeout
    from backend.engine.records import Completion, Delta, EngineStats, GenerateRequest
    from backend.engine.sampling_params import SamplingParams

_EXPORTS = {
    "Completion": "backend.engine.records",
    "Delta": "backend.engine.records",
    "Engine": "backend.engine.core",
    "EngineConfig": "backend.engine.engine_config",
    "EngineOverloaded": "backend.engine.errors",
    "EngineStats": "backend.engine.records",
    "GenerateRequest": "backend.engine.records",
    "InvalidGenerateRequest": "backend.engine.errors",
    "QueueTimeout": "backend.engine.errors",
    "SamplingParams": "backend.engine.sampling_params",
}

__all__ = [
    "Completion",
    "Delta",
    "Engine",
    "EngineConfig",
    "EngineOverloaded",
    "EngineStats",
    "GenerateRequest",
    "InvalidGenerateRequest",
    "QueueTimeout",
    "SamplingParams",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'backend' has no attribute {name!r}")
