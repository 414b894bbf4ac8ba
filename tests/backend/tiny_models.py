"""Tiny random Llama-family checkpoints written to disk: HF folders, and GGUF (any tensor types) by the product's
converter (backend/loading/gguf/writer.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, pre_tokenizers
from tokenizers.models import BPE

from backend.executor.model.config import ModelConfig
from backend.loading.gguf.tokenizer import byte_alphabet
from backend.loading.gguf.writer import ENCODABLE_TYPES, encode_tensor, gguf_tensors
from backend.loading.gguf.writer import write_gguf as write_model_gguf
from backend.loading.hf_vocab import GGUFVocab

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


# Where each type's float16 scales sit in its block (the rest is random quants).
_SCALE_OFFSETS = {Q.Q2_K: (-4, -2), Q.Q3_K: (-2,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (-2,), Q.IQ4_NL: (0,),
                  Q.IQ4_XS: (0,)}
# The byte-level BPE of `byte_vocab` (no merges), EOS and BOS its last token.
BYTE_VOCAB = GGUFVocab(tokens=byte_vocab(), token_types=[1] * 256 + [3], merges=[], pre="default", bos_id=256,
                       eos_id=256)


def _random_blocks(rows: int, cols: int, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """Random blocks with sane scales, for the types gguf-py can dequantise but not quantise."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.004).tobytes(), dtype=np.uint8)
    for offset in _SCALE_OFFSETS.get(qtype, ()):
        data[..., offset : offset + 2 or None] = scale
    return data.reshape(rows, -1)


def write_gguf(path: Path, state: dict[str, torch.Tensor], config: Any, *, types: dict[str, Q] | None = None,
               seed: int = 0) -> Path:
    """HF-named tensors through the product's converter; `types` maps a GGUF tensor name to its type (default F32).

    Types gguf-py cannot encode (K-quants, IQ4) get random blocks; the caller compares against a reference that
    reads the same file, so the values need not come from `state`.
    """
    rng = np.random.default_rng(seed)
    chosen = types or {}

    def encode(w: np.ndarray, qtype: Q) -> np.ndarray:
        return encode_tensor(w, qtype) if qtype in ENCODABLE_TYPES else _random_blocks(*w.shape, qtype, rng)

    raw = config.to_dict()
    tensors = gguf_tensors(ModelConfig.from_hf_config(raw), state.items())
    return write_model_gguf(path, raw, BYTE_VOCAB, tensors, lambda name, _: chosen.get(name, Q.F32), encode=encode)
