"""The HF-folder-to-GGUF converter: every family's saved folder converts to a file that loads to the folder's
logits; types are chosen per tensor (uniform, llama.cpp's Q4_K_M recipe); a real tokenizer survives the trip."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from backend.loading.gguf.weights import read_metadata
from backend.loading.gguf.writer import ENCODABLE_TYPES, main, q4_k_m
from backend.loading.hf_vocab import save_gguf_tokenizer
from backend.loading.loader import load_model
from tests.backend.family_models import FAMILIES, SIZES, build
from tests.backend.model_harness import prefill_logits
from tests.backend.tiny_models import tiny_hf_model

PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]
TEXTS = ["Hello, world!", "def f(x):\n    return x ** 2  # square", "東京は日本の首都です。", "emoji 🙂👍 and  runs   of\t\tspace",
         "12345 digits 3.14159", "naïve café <|im_start|>user\nhi<|im_end|>"]


def tensor_types(path: Path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


def converted(tmp_path: Path, family: str, type_name: str) -> tuple[Path, Path]:
    """A family's tiny folder and its conversion through the command line."""
    folder, out = tmp_path / "hf", tmp_path / f"{type_name}.gguf"
    build(FAMILIES[family], folder)
    main([str(folder), str(out), "--type", type_name])
    return folder, out


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_saved_folder_converts_to_the_same_logits(tmp_path: Path, name: str) -> None:
    folder, out = converted(tmp_path, name, "F32")
    ours, original = load_model(out), load_model(folder)
    assert ours.config.architecture == original.config.architecture
    torch.testing.assert_close(prefill_logits(ours.model, PROMPT), prefill_logits(original.model, PROMPT),
                               rtol=1e-5, atol=1e-5)


def test_q8_0_quantizes_matrices_and_keeps_vectors_and_router_float(tmp_path: Path) -> None:
    folder, out = converted(tmp_path, "qwen3moe", "Q8_0")
    types = tensor_types(out)
    assert types["blk.0.attn_q.weight"] == types["blk.0.ffn_up_exps.weight"] == types["token_embd.weight"] == "Q8_0"
    assert types["blk.0.attn_norm.weight"] == types["blk.0.ffn_gate_inp.weight"] == "F32"
    # Q8_0 round-trips these weights (|w| ~ 0.08) to about 1e-3; the logits (|logit| ~ 1) move by about 1e-2.
    torch.testing.assert_close(prefill_logits(load_model(out).model, PROMPT),
                               prefill_logits(load_model(folder).model, PROMPT), rtol=0, atol=0.1)


def test_q4_k_m_recipe_follows_llama_cpp_at_qwen2_5_0_5b_shapes() -> None:
    choose = q4_k_m(num_layers=24, tied=True)
    q4k = Q.Q4_K if Q.Q4_K in ENCODABLE_TYPES else Q.Q4_0
    q6k = Q.Q6_K if Q.Q6_K in ENCODABLE_TYPES else Q.Q8_0
    # 896-wide rows are no multiple of 256: llama.cpp's quantizer writes Q5_0 for Q4_K and Q8_0 for Q6_K there.
    assert choose("blk.5.attn_q.weight", (896, 896)) == Q.Q5_0
    assert choose("blk.0.attn_v.weight", (128, 896)) == Q.Q8_0  # first eighth: more bits
    assert choose("token_embd.weight", (151936, 896)) == Q.Q8_0  # tied: the output head's Q6_K
    assert choose("blk.4.ffn_down.weight", (896, 4864)) == q4k  # 4864 = 19 * 256
    assert choose("blk.5.ffn_down.weight", (896, 4864)) == q6k  # every third layer between: more bits
    assert choose("blk.23.ffn_down.weight", (896, 4864)) == q6k  # last eighth
    assert choose("blk.5.attn_norm.weight", (896,)) == Q.F32


def test_q4_k_m_file_loads_with_its_fallback_types(tmp_path: Path) -> None:
    _, out = converted(tmp_path, "llama3", "Q4_K_M")
    types = tensor_types(out)
    assert types["blk.1.attn_q.weight"] == "Q5_0" and types["output.weight"] == "Q8_0"  # 64-wide rows
    assert types["rope_freqs.weight"] == "F32"
    assert load_model(out).config.architecture == "llama"


def test_smollm2_tokenizer_and_template_survive_the_conversion(tmp_path: Path, model_path: Path) -> None:
    from transformers import LlamaConfig

    meta = read_metadata(gguf.GGUFReader(model_path))
    folder = tmp_path / "hf"
    model = tiny_hf_model(LlamaConfig(**{**SIZES, "vocab_size": 49152}))
    model.save_pretrained(folder)
    save_gguf_tokenizer(meta, folder)
    out = tmp_path / "smol.gguf"
    main([str(folder), str(out), "--type", "F16"])
    written = read_metadata(gguf.GGUFReader(out))
    assert written["tokenizer.ggml.pre"] == "smollm"
    assert written["tokenizer.ggml.tokens"] == meta["tokenizer.ggml.tokens"]
    assert written["tokenizer.ggml.merges"] == meta["tokenizer.ggml.merges"]
    ours, original = load_model(out).tokenizer, load_model(model_path).tokenizer
    assert [ours.encode(t) for t in TEXTS] == [original.encode(t) for t in TEXTS]
    assert ours.eos_token_ids == original.eos_token_ids
    messages = [{"role": "user", "content": "What is 2+2?"}]
    assert ours.apply_chat_template(messages) == original.apply_chat_template(messages)
    assert json.loads((folder / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"


def test_unknown_type_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path), str(tmp_path / "x.gguf"), "--type", "Q3_K_S"])
