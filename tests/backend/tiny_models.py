"""Tiny random Llama-family checkpoints written to disk: GGUF (any tensor types) and HF folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, pre_tokenizers
from tokenizers.models import BPE

from backend.loading.gguf_tokenizer import byte_alphabet

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 256, 4, 2, 512, 2
EOS = "<|endoftext|>"


def tiny_config(model_type: str = "llama", **overrides: Any) -> Any:
    from transformers import LlamaConfig, Qwen2Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[model_type]
    fields: dict[str, Any] = dict(
        vocab_size=257,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    fields.update(overrides)
    return cls(**fields)


def tiny_hf_model(config: Any, seed: int = 0) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():  # larger than init's 0.02 so that every layer moves the logits
            p.normal_(0, 0.08)
    return model.eval()


def byte_vocab() -> list[str]:
    return [*byte_alphabet().values(), EOS]


def write_hf_folder(model: Any, folder: Path) -> Path:
    """`save_pretrained` plus a byte-level tokenizer.json over the same 257-token vocabulary."""
    model.save_pretrained(folder)
    tok = HFTokenizer(BPE(vocab={t: i for i, t in enumerate(byte_vocab())}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(f'{{"eos_token": "{EOS}"}}')
    return folder


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp's converter layout for Q/K of llama-arch models.
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# Where each type's float16 scales sit in its block (the rest is random quants).
_SCALE_OFFSETS = {Q.Q2_K: (-4, -2), Q.Q3_K: (-2,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (-2,), Q.IQ4_NL: (0,),
                  Q.IQ4_XS: (0,)}


def _random_blocks(rows: int, cols: int, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """Random blocks with sane scales, for the types gguf-py can dequantise but not quantise."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.004).tobytes(), dtype=np.uint8)
    for offset in _SCALE_OFFSETS[qtype]:
        data[..., offset : offset + 2 or None] = scale
    return data.reshape(rows, -1)


_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_gguf(
    path: Path,
    state: dict[str, torch.Tensor],
    config: Any,
    *,
    arch: str = "llama",
    types: dict[str, Q] | None = None,
    extra: dict[str, np.ndarray] | None = None,
    seed: int = 0,
) -> Path:
    """Write HF-named tensors as a GGUF; `types` maps a GGUF tensor name to its type (default F32).

    `extra` adds tensors as they are (F32), such as llama.cpp's `rope_freqs.weight`.
    K-quant and IQ4 tensors get random content (gguf-py cannot encode them); the caller compares against a
    reference that reads the same file, so the values need not come from `state`.
    """
    rng = np.random.default_rng(seed)
    types = types or {}
    writer = gguf.GGUFWriter(path, arch)
    add_shape(writer, config)
    writer.add_rope_freq_base(float(getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]))
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    add_byte_tokenizer(writer)
    for hf_name, tensor in state.items():
        name = _gguf_name(hf_name)
        w = tensor.detach().float().numpy()
        if arch == "llama" and name.endswith("attn_q.weight"):
            w = _permute(w, config.num_attention_heads)
        elif arch == "llama" and name.endswith("attn_k.weight"):
            w = _permute(w, config.num_key_value_heads)
        qtype = types.get(name, Q.F32)
        if qtype in _SCALE_OFFSETS:
            writer.add_tensor(name, _random_blocks(*w.shape, qtype, rng), raw_dtype=qtype)
        elif qtype == Q.F32:
            writer.add_tensor(name, np.ascontiguousarray(w))
        else:
            writer.add_tensor(name, quantize(w, qtype), raw_dtype=qtype)
    return finish_gguf(writer, path, extra or {})


def finish_gguf(writer: gguf.GGUFWriter, path: Path, extra: dict[str, np.ndarray]) -> Path:
    """Add `extra` tensors as they are, then write the file."""
    for name, array in extra.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def add_shape(writer: gguf.GGUFWriter, config: Any) -> None:
    """The `{arch}.*` sizes of a transformers config."""
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)


def add_byte_tokenizer(writer: gguf.GGUFWriter) -> None:
    """The byte-level BPE of `byte_vocab` (no merges), EOS and BOS its last token."""
    vocab = byte_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab)
    writer.add_token_types([1] * (len(vocab) - 1) + [3])
    writer.add_token_merges([])
    writer.add_eos_token_id(len(vocab) - 1)
    writer.add_bos_token_id(len(vocab) - 1)


def _gguf_name(hf_name: str) -> str:
    globals_ = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if hf_name in globals_:
        return globals_[hf_name]
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{_GGUF_NAMES[rest]}"
