"""The engine is configured from the backend's settings as they are: one definition of each field."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import torch

from backend.engine.engine_config import EngineConfig
from config import BackendSettings, EngineSettings


def test_the_engine_takes_every_engine_setting_of_a_replica() -> None:
    settings = BackendSettings(max_num_seqs=7, kv_cache_memory="64MiB", cuda_graphs=False, threads=2,
                               enable_prefix_caching=False, queue_timeout=5.0, port=9100)
    config = EngineConfig.for_model(settings, Path("m.gguf"))
    assert config.model_path == Path("m.gguf")
    for name in EngineSettings.model_fields:
        assert getattr(config, name) == getattr(settings, name), name
    assert config.kv_cache_memory == 64 * 1024 * 1024


def test_the_model_path_may_come_first_and_is_required() -> None:
    assert EngineConfig(Path("a.gguf"), threads=1).model_path == Path("a.gguf")
    assert EngineConfig(model_path="b.gguf").model_path == Path("b.gguf")
    with pytest.raises(pydantic.ValidationError, match="model_path"):
        EngineConfig(threads=1)


def test_an_out_of_range_engine_setting_is_refused_naming_the_field() -> None:
    with pytest.raises(pydantic.ValidationError, match="max_num_seqs"):
        EngineConfig(Path("m.gguf"), max_num_seqs=0)


def test_auto_dtype_is_float32_on_cpu_and_bfloat16_on_cuda() -> None:
    assert EngineConfig(Path("m.gguf")).torch_dtype() is torch.float32
    assert EngineConfig(Path("m.gguf"), device="cuda").torch_dtype() is torch.bfloat16
    assert EngineConfig(Path("m.gguf"), dtype="float16").torch_dtype() is torch.float16


def test_auto_kv_cache_dtype_is_float16_on_cpu_and_the_weights_dtype_elsewhere() -> None:
    assert EngineConfig(Path("m.gguf")).kv_torch_dtype() is torch.float16
    assert EngineConfig(Path("m.gguf"), dtype="bfloat16").kv_torch_dtype() is torch.bfloat16
    assert EngineConfig(Path("m.gguf"), device="cuda").kv_torch_dtype() is torch.bfloat16
    assert EngineConfig(Path("m.gguf"), kv_cache_dtype="float32").kv_torch_dtype() is torch.float32
