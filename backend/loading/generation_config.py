"""A model's generation defaults: the sampling values a request gets for the fields it leaves out.

`auto` takes tidegate's measured values for the models it ships (generation_defaults.json, keyed by file
name), else the model's own (an HF folder's generation_config.json, a GGUF file's `general.sampling.*`);
`none` uses none; a path names a generation_config.json (or a folder holding one). An override JSON object
goes on top of any of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The engine's sampling fields a model's defaults may set (what a request that leaves them out gets).
DEFAULTABLE = ("temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty", "repetition_penalty")
SHIPPED_TABLE = Path(__file__).with_name("generation_defaults.json")
_HF_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
            "repetition_penalty": "repetition_penalty"}
_GGUF_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_p": "top_p",
              "general.sampling.top_k": "top_k", "general.sampling.penalty_repeat": "repetition_penalty"}


class GenerationConfigError(ValueError):
    """A generation config that cannot be used; the message names the source and the field."""


def generation_defaults(model_path: Path, mode: str = "auto", override: str | None = None) -> dict[str, Any]:
    """The effective defaults for `model_path` (only the fields that have one); the caller checks their ranges."""
    if mode == "none":
        defaults: dict[str, Any] = {}
    elif mode == "auto":
        # a measured setting is a whole: it replaces the file's own values rather than mixing with them
        defaults = _shipped(model_path.name) or _model_own(model_path)
    else:
        path = Path(mode).expanduser()
        defaults = _from_hf_file(path / "generation_config.json" if path.is_dir() else path)
    if override:
        defaults.update(_override(override))
    return defaults


def _model_own(model_path: Path) -> dict[str, Any]:
    if model_path.is_dir():
        config = model_path / "generation_config.json"
        return _from_hf_file(config) if config.exists() else {}
    if model_path.suffix == ".gguf":
        return _from_gguf(model_path)
    return {}


def _from_hf_file(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise GenerationConfigError(f"cannot read generation config {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise GenerationConfigError(f"{path} must hold a JSON object")
    return _typed({field: raw[key] for key, field in _HF_KEYS.items() if key in raw})


def _from_gguf(path: Path) -> dict[str, Any]:
    from backend.loading.gguf.reader import read_header

    metadata = read_header(path).metadata
    return _typed({field: metadata[key] for key, field in _GGUF_KEYS.items() if key in metadata})


def _shipped(file_name: str) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = json.loads(SHIPPED_TABLE.read_text())
    entry = table.get(file_name, {})
    return _typed({k: v for k, v in entry.items() if k in DEFAULTABLE})


def _override(text: str) -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise GenerationConfigError(f"--override-generation-config is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise GenerationConfigError("--override-generation-config must be a JSON object")
    unknown = sorted(set(raw) - set(DEFAULTABLE))
    if unknown:
        raise GenerationConfigError(
            f"--override-generation-config: unknown field(s) {unknown}; known: {', '.join(DEFAULTABLE)}")
    return _typed(raw)


def _typed(values: dict[str, Any]) -> dict[str, Any]:
    # top_k is an integer field; every other default is a float (JSON and GGUF may store 1 for 1.0).
    out: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise GenerationConfigError(f"generation default `{name}` must be a number, got {value!r}")
        out[name] = int(value) if name == "top_k" else float(value)
    if out.get("top_k") == -1:
        out["top_k"] = 0  # vLLM and HF spell "off" as -1 too
    return out
