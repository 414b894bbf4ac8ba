"""Generation defaults: where `auto` finds them, what `none` and a path mean, how an override applies."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest

from backend.loading.generation_config import SHIPPED_TABLE, GenerationConfigError, generation_defaults


def gguf_with_sampling(path: Path, **keys: float) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in keys.items():
        if key == "top_k":
            writer.add_uint32(f"general.sampling.{key}", int(value))
        else:
            writer.add_float32(f"general.sampling.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_auto_reads_an_hf_folders_generation_config(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": -1, "do_sample": True, "eos_token_id": 2}))
    assert generation_defaults(tmp_path) == {"temperature": 0.6, "top_p": 0.95, "top_k": 0}


def test_auto_reads_gguf_sampling_metadata(tmp_path: Path) -> None:
    path = gguf_with_sampling(tmp_path / "m.gguf", temp=0.5, top_k=30, penalty_repeat=1.1)
    got = generation_defaults(path)
    assert got["top_k"] == 30 and got["temperature"] == 0.5
    assert got["repetition_penalty"] == pytest.approx(1.1)


def test_the_shipped_table_wins_for_a_model_tidegate_ships(tmp_path: Path) -> None:
    name, shipped = next(iter(json.loads(SHIPPED_TABLE.read_text()).items()))
    path = gguf_with_sampling(tmp_path / name, temp=1.5, top_p=0.5)
    assert generation_defaults(path) == {k: v for k, v in shipped.items() if not k.startswith("_")}


def test_none_a_path_and_an_override(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text('{"temperature": 0.3}')
    model = gguf_with_sampling(tmp_path / "m.gguf", temp=0.9)
    assert generation_defaults(model, "none") == {}
    assert generation_defaults(model, str(tmp_path)) == {"temperature": 0.3}
    assert generation_defaults(model, "none", '{"top_p": 0.8, "top_k": 5}') == {"top_p": 0.8, "top_k": 5}


@pytest.mark.parametrize("override, named", [('{"temprature": 0}', "temprature"), ("[1]", "JSON object"),
                                             ("{", "not JSON"), ('{"top_p": "high"}', "top_p")])
def test_a_bad_override_is_refused_naming_what_is_wrong(tmp_path: Path, override: str, named: str) -> None:
    with pytest.raises(GenerationConfigError, match=named):
        generation_defaults(tmp_path, "none", override)
