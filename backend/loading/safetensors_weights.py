"""Reading a Hugging Face model folder: `config.json` and its `*.safetensors` shards."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from backend.executor.cpu.quant_blocks import Weight
from backend.executor.model.config import ModelConfig, UnsupportedModelError


def read_hf_folder(folder: Path) -> tuple[ModelConfig, dict[str, Weight]]:
    """The config and every tensor (float32, Hugging Face names) of a transformers checkpoint folder."""
    config_file = folder / "config.json"
    if not config_file.exists():
        raise UnsupportedModelError(f"{folder} has no config.json")
    config = ModelConfig.from_hf_config(json.loads(config_file.read_text()))
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise UnsupportedModelError(f"{folder} has no *.safetensors weights")
    weights: dict[str, Weight] = {}
    for shard in shards:
        for name, tensor in load_file(str(shard)).items():
            # Rotary caches saved by old checkpoints are recomputed, not loaded.
            if name.endswith("rotary_emb.inv_freq"):
                continue
            weights[name] = tensor.float()
    return config, weights
