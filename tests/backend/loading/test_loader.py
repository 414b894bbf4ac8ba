"""load_model: GGUF of every supported tensor type and HF folders give transformers' logits; bad files fail clearly."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from backend.executor.cpu.quant_blocks import BlockQuantized
from backend.executor.model.config import UnsupportedModelError
from backend.loading.gguf.weights import read_gguf
from backend.loading.loader import HandedOver, load_model
from tests.backend.model_harness import prefill_logits
from tests.backend.tiny_models import tiny_config, tiny_hf_model, write_gguf, write_hf_folder

PROMPT = [*range(3, 60, 2), 200, 17, 17, 42]


def hf_logits(model: Any, prompt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([prompt])).logits[0].float()


def transformers_from_gguf(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def test_smollm2_gguf_loads_with_its_shape_and_tokenizer(model_path: Path) -> None:
    loaded = load_model(model_path)
    cfg = loaded.config
    assert (cfg.architecture, cfg.num_layers, cfg.hidden_size) == ("llama", 30, 576)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (9, 3, 64, 49152)
    assert cfg.tie_word_embeddings and loaded.model.lm_head is loaded.model.embed_tokens
    assert cfg.rope_theta == 100000.0 and cfg.max_position_embeddings == 8192
    assert loaded.tokenizer.max_context == 8192
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("Hello, world!")) == "Hello, world!"


LAYER_TYPES = {
    # layer 0: K-quants; layer 1: the block quants and half floats
    "blk.0.attn_q.weight": Q.Q4_K,
    "blk.0.attn_k.weight": Q.Q5_K,
    "blk.0.attn_v.weight": Q.Q6_K,
    "blk.0.attn_output.weight": Q.Q4_K,
    "blk.0.ffn_gate.weight": Q.Q5_K,
    "blk.0.ffn_up.weight": Q.Q6_K,
    "blk.0.ffn_down.weight": Q.Q4_K,
    "blk.1.attn_q.weight": Q.Q8_0,
    "blk.1.attn_k.weight": Q.Q4_0,
    "blk.1.attn_v.weight": Q.Q4_1,
    "blk.1.attn_output.weight": Q.F16,
    "blk.1.ffn_gate.weight": Q.BF16,
    "blk.1.ffn_up.weight": Q.Q8_0,
    "blk.1.ffn_down.weight": Q.Q4_1,
    "token_embd.weight": Q.Q8_0,
    "output.weight": Q.F16,
}


def test_every_supported_tensor_type_gives_transformers_logits(tmp_path: Path) -> None:
    config = tiny_config("llama")
    path = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(config).state_dict(), config, types=LAYER_TYPES)
    ours = load_model(path)
    assert ours.config.architecture == "llama" and not ours.config.tie_word_embeddings
    torch.testing.assert_close(
        prefill_logits(ours.model, PROMPT), hf_logits(transformers_from_gguf(path), PROMPT), rtol=1e-4, atol=1e-4
    )


def test_llama_gguf_rotary_permutation_is_undone(tmp_path: Path) -> None:
    # Exact F32 weights: our logits must equal the original HF model's, not just transformers' reading of the file.
    config = tiny_config("llama")
    model = tiny_hf_model(config, seed=1)
    path = write_gguf(tmp_path / "tiny.gguf", model.state_dict(), config)
    torch.testing.assert_close(prefill_logits(load_model(path).model, PROMPT), hf_logits(model, PROMPT), rtol=1e-4, atol=1e-4)


def test_qwen2_gguf_with_attention_biases(tmp_path: Path) -> None:
    config = tiny_config("qwen2")
    model = tiny_hf_model(config, seed=2)
    path = write_gguf(tmp_path / "qwen.gguf", model.state_dict(), config)
    ours = load_model(path)
    assert ours.config.architecture == "qwen2" and ours.config.attention_bias
    torch.testing.assert_close(prefill_logits(ours.model, PROMPT), hf_logits(model, PROMPT), rtol=1e-4, atol=1e-4)


def test_gguf_rope_freqs_factors_reproduce_llama3_scaling(tmp_path: Path) -> None:
    # llama.cpp stores Llama 3.1 RoPE scaling as per-frequency divisors in `rope_freqs.weight`; the converter
    # writes them from the config.
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    config = tiny_config("llama", rope_scaling=scaling, rope_theta=500000.0)
    model = tiny_hf_model(config, seed=6)
    plain = load_model(write_hf_folder(tiny_hf_model(tiny_config("llama", rope_theta=500000.0)), tmp_path / "p"))
    scaled = load_model(write_hf_folder(model, tmp_path / "s"))
    factors = (plain.model.rotary.inv_freq / scaled.model.rotary.inv_freq).numpy()
    assert (factors > 1).any()  # the scaling really changes some frequencies
    path = write_gguf(tmp_path / "l3.gguf", model.state_dict(), config)
    written = next(t for t in gguf.GGUFReader(path).tensors if t.name == "rope_freqs.weight")
    np.testing.assert_allclose(np.asarray(written.data), factors, rtol=1e-6)
    torch.testing.assert_close(prefill_logits(load_model(path).model, PROMPT), hf_logits(model, PROMPT), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [
        ("llama", {}),
        ("llama", {"tie_word_embeddings": True, "head_dim": 32}),
        ("qwen2", {"tie_word_embeddings": True}),
        (
            "llama",
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16,
                },
                "rope_theta": 500000.0,
            },
        ),
        ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    ],
)
def test_hf_folder_gives_transformers_logits(tmp_path: Path, model_type: str, overrides: dict[str, Any]) -> None:
    model = tiny_hf_model(tiny_config(model_type, **overrides), seed=3)
    folder = write_hf_folder(model, tmp_path / "model")
    ours = load_model(folder)
    assert ours.config.tie_word_embeddings == model.config.tie_word_embeddings
    assert ours.tokenizer.encode("hi") == [ord("h") - 33 + 0, ord("i") - 33]  # printable bytes map in order
    torch.testing.assert_close(prefill_logits(ours.model, PROMPT), hf_logits(model, PROMPT), rtol=1e-4, atol=1e-4)


def test_bfloat16_dtype_is_honoured(tmp_path: Path) -> None:
    model = tiny_hf_model(tiny_config("llama"), seed=4)
    ours = load_model(write_hf_folder(model, tmp_path / "model"), dtype=torch.bfloat16)
    assert ours.model.embed_tokens.dtype == torch.bfloat16
    logits = prefill_logits(ours.model, PROMPT)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, hf_logits(model, PROMPT), rtol=0.1, atol=0.15)


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    path = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(path, "mamba")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="'mamba'"):
        load_model(path)


# Types no kernel computes: Q5_1 encoded from the weights, Q3_K and IQ4_NL random blocks.
DEQUANTIZED_TYPES = {
    "blk.0.attn_q.weight": Q.Q5_1, "blk.0.attn_k.weight": Q.Q5_1, "blk.0.ffn_up.weight": Q.Q5_1,
    "blk.1.ffn_gate.weight": Q.Q5_1, "blk.1.attn_v.weight": Q.Q3_K, "blk.1.ffn_down.weight": Q.IQ4_NL,
}


@pytest.mark.parametrize("quantization", ["none", "auto"])
def test_types_without_a_kernel_load_dequantized_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, quantization: str
) -> None:
    config = tiny_config("llama")
    path = write_gguf(tmp_path / "q5.gguf", tiny_hf_model(config).state_dict(), config, types=DEQUANTIZED_TYPES)
    with caplog.at_level(logging.WARNING, logger="backend.loading.gguf.weights"):
        ours = load_model(path, quantization=quantization)
    torch.testing.assert_close(
        prefill_logits(ours.model, PROMPT), hf_logits(transformers_from_gguf(path), PROMPT), rtol=1e-4, atol=1e-4
    )
    [record] = [r for r in caplog.records if r.name == "backend.loading.gguf.weights"]
    assert "has 1 IQ4_NL, 1 Q3_K, 4 Q5_1 tensors; no kernel computes IQ4_NL/Q3_K/Q5_1 natively" in (
        record.getMessage())


def test_q5_0_matrices_are_kept_in_their_own_blocks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tiny_config("llama")
    types = {"blk.0.attn_output.weight": Q.Q5_0, "blk.1.ffn_up.weight": Q.Q5_0}
    path = write_gguf(tmp_path / "q5_0.gguf", tiny_hf_model(config).state_dict(), config, types=types)
    with caplog.at_level(logging.WARNING, logger="backend.loading.gguf.weights"):
        contents = read_gguf(path, keep_blocks=True)
    assert not [r for r in caplog.records if r.name == "backend.loading.gguf.weights"]  # nothing is dequantized
    file_tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    for gguf_name, hf_name in (("blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight"),
                               ("blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight")):
        kept = contents.weights[hf_name]
        assert isinstance(kept, BlockQuantized) and kept.kind == "Q5_0"
        t = file_tensors[gguf_name]
        assert kept.blocks.numel() == t.data.nbytes  # 5.5 bits per weight, as the file
        reference = torch.from_numpy(dequantize(t.data, t.tensor_type).reshape(kept.shape))
        assert torch.equal(kept.dequantize(), reference)


def test_unreadable_tensor_type_is_refused_by_name(tmp_path: Path) -> None:
    # Q8_K exists only as llama.cpp's intermediate for dot products: gguf-py cannot read it, nor can we.
    config = tiny_config("llama")
    path = write_gguf(tmp_path / "q8k.gguf", tiny_hf_model(config).state_dict(), config,
                      types={"blk.0.ffn_up.weight": Q.Q8_K})
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.ffn_up\.weight has unsupported type Q8_K"):
        load_model(path)


def test_unsupported_hf_model_type_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "gpt_neox"}')
    with pytest.raises(UnsupportedModelError, match="'gpt_neox'"):
        load_model(tmp_path)


def test_missing_file_and_unknown_format_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="model not found"):
        load_model(tmp_path / "absent.gguf")
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\0" * 16)
    with pytest.raises(UnsupportedModelError, match=r"expected a \.gguf file"):
        load_model(other)


def test_hf_folder_without_weights_fails_clearly(tmp_path: Path) -> None:
    tiny_config("llama").save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="safetensors"):
        load_model(tmp_path)


def test_handed_over_weights_leave_the_dict_as_they_are_taken() -> None:
    weights: dict[str, Any] = {"a": np.zeros(1), "b": np.ones(1)}
    handed = HandedOver(weights)
    assert len(handed) == 2 and handed["b"][0] == 1
    seen = []
    for name, _ in handed.items():
        seen.append((name, len(weights)))
    assert seen == [("a", 1), ("b", 0)] and not weights
