"""Reading a GGUF file: its metadata and its tensors, renamed to Hugging Face names, dequantised to float32 or
(on request) matrices in Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K kept in their blocks for the quantized products.
Any type the `gguf` package can dequantize loads; one no kernel computes is named in one warning at load."""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from backend.executor.cpu.quant_blocks import BLOCK_BYTES, BlockQuantized, Weight
from backend.executor.model.config import SUPPORTED_ARCHITECTURES, ModelConfig, UnsupportedModelError
from backend.executor.model.families import FAMILIES
from backend.loading.gguf.reader import TensorInfo, read_header, read_tensor

log = logging.getLogger(__name__)
_FLOATS = frozenset(GGMLQuantizationType[name] for name in ("F32", "F16", "BF16"))


def _readable(qtype: GGMLQuantizationType) -> bool:
    """Whether the installed `gguf` package dequantizes this type (it grows new ones release by release)."""
    if qtype in _FLOATS:
        return True
    block_bytes = GGML_QUANT_SIZES.get(qtype, (0, 0))[1]
    try:
        dequantize(np.zeros((1, block_bytes), dtype=np.uint8), qtype)
    except (NotImplementedError, ValueError, KeyError):
        return False
    return block_bytes > 0


SUPPORTED_TENSOR_TYPES = frozenset(q for q in GGMLQuantizationType if _readable(q))


def tensor_support(architecture: str, type_name: str) -> str:
    """What loading a matrix of this GGUF type into this architecture does, as docs/models.md's table says:
    "computed natively" (float32, or the file's blocks under `--quantization auto` where the block kernel
    builds), "dequantized" (to the model's float dtype at load) or "refused" (named at start)."""
    known = type_name in GGMLQuantizationType.__members__
    if architecture not in SUPPORTED_ARCHITECTURES or not known or GGMLQuantizationType[type_name] not in SUPPORTED_TENSOR_TYPES:
        return "refused"
    native = type_name == "F32" or type_name in BLOCK_BYTES
    return "computed natively" if native else "dequantized"


_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^(?P<kind>\w+)\.(?P<index>\d+)\.weight$")
# llama.cpp's RoPE frequency divisors: Llama 3's precomputed scaling, Phi-3 LongRoPE's short factors (the long
# ones are unused: the context is capped at the original one, see config.py).
_ROPE_FREQS = ("rope_freqs.weight", "rope_factors_short.weight")
_UNUSED = ("rope_factors_long.weight",)


@dataclass(slots=True)
class GGUFContents:
    """Everything the loader needs from one GGUF file."""

    metadata: dict[str, Any]
    config: ModelConfig
    weights: dict[str, Weight]  # Hugging Face names, HF layout; float32 unless kept in blocks
    rope_freq_factors: torch.Tensor | None  # llama.cpp's precomputed llama3 RoPE factors, when present


def read_metadata(reader: GGUFReader) -> dict[str, Any]:
    """All key/values of the file as Python values (strings, numbers, lists), as the `gguf` package reads them:
    the reference `reader.read_header`'s metadata equals."""
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


def read_gguf(path: Path, *, keep_blocks: bool = False) -> GGUFContents:
    """Parse metadata and dequantise every tensor (with `keep_blocks`, all but the Q4_0, Q4_1, Q8_0, Q4_K, Q5_K
    and Q6_K matrices and stacks of them);
    fails naming an unsupported architecture or tensor type."""
    header = read_header(path)
    metadata = header.metadata
    tensors = {t.name: t for t in header.tensors}
    embed = tensors.get("token_embd.weight")
    if embed is None:
        raise UnsupportedModelError(f"{path.name} has no token_embd.weight tensor")
    config = ModelConfig.from_gguf_metadata(
        metadata, vocab_size=int(embed.shape[-1]), tied="output.weight" not in tensors
    )
    for t in header.tensors:
        if t.tensor_type not in SUPPORTED_TENSOR_TYPES:
            raise UnsupportedModelError(
                f"tensor {t.name} has unsupported type {t.tensor_type.name}; supported: "
                + ", ".join(sorted(q.name for q in SUPPORTED_TENSOR_TYPES))
            )
    _warn_dequantized(path, header.tensors, config.architecture)
    family = FAMILIES[config.architecture]
    names = layer_names(config.architecture)
    freq_factors = None
    weights: dict[str, Weight] = {}
    with path.open("rb", buffering=0) as file:
        for name, t in tensors.items():
            if name in _UNUSED:
                continue
            # GGUF lists dims fastest-first; torch wants them slowest-first.
            shape = tuple(reversed(t.shape))
            data = read_tensor(file, header, t)
            tensor: Weight
            if keep_blocks and t.tensor_type.name in BLOCK_BYTES and len(shape) >= 2:
                # A stack of matrices (a MoE layer's experts, `[experts, out, in]`) is kept as all its rows.
                rows = int(np.prod(shape[:-1]))
                tensor = BlockQuantized(t.tensor_type.name, torch.from_numpy(data.reshape(rows, -1)), (rows, shape[-1]))
            else:
                array = np.asarray(dequantize(data, t.tensor_type), dtype=np.float32)
                del data  # a block type's bytes, before the next tensor's arrive
                tensor = torch.from_numpy(np.ascontiguousarray(array).reshape(shape))
            if name in _ROPE_FREQS:
                assert isinstance(tensor, torch.Tensor)
                freq_factors = tensor
                continue
            hf_name = _hf_name(name, names)
            if family.GGUF_NORM_SHIFT and hf_name.endswith("norm.weight"):
                assert isinstance(tensor, torch.Tensor)
                tensor = tensor - family.GGUF_NORM_SHIFT
            if family.GGUF_PERMUTED_QK and ".self_attn.q_proj." in hf_name:
                tensor = _unpermute(tensor, config.num_heads)
            elif family.GGUF_PERMUTED_QK and ".self_attn.k_proj." in hf_name:
                tensor = _unpermute(tensor, config.num_kv_heads)
            weights[hf_name] = tensor
    return GGUFContents(metadata, config, weights, freq_factors)


def layer_names(architecture: str) -> dict[str, str]:
    """GGUF names of a layer's tensors (`attn_q.weight`) to the Hugging Face ones (`self_attn.q_proj.weight`)."""
    return {**_LAYER_NAMES, **FAMILIES[architecture].GGUF_NAMES}


def _warn_dequantized(path: Path, tensors: list[TensorInfo], architecture: str) -> None:
    """One line for the quantized types no kernel computes: they load as float32, several times their size."""
    counts: Counter[str] = Counter()
    extra_bytes = 0
    for t in tensors:
        if t.tensor_type in _FLOATS or tensor_support(architecture, t.tensor_type.name) != "dequantized":
            continue
        counts[t.tensor_type.name] += 1
        extra_bytes += int(t.n_elements) * 4 - int(t.n_bytes)
    if counts:
        listed = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
        types = "/".join(sorted(counts))
        log.warning("%s has %s tensors; no kernel computes %s natively, dequantized to float32 (+%.0f MiB)",
                    path.name, listed, types, extra_bytes / 2**20)


def _hf_name(name: str, names: dict[str, str]) -> str:
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    match = _LAYER.match(name)
    if match:
        layer, rest = match.groups()
        if rest in names:
            return f"model.layers.{layer}.{names[rest]}"
        # One tensor per expert (older Mixtral files: `ffn_gate.3.weight`), named in `names` as `ffn_gate.{expert}.weight`.
        expert = _EXPERT.match(rest)
        template = names.get(f"{expert['kind']}.{{expert}}.weight") if expert else None
        if expert and template:
            return f"model.layers.{layer}." + template.format(expert=expert["index"])
    raise UnsupportedModelError(f"unexpected tensor {name!r} in GGUF file")


def _unpermute(weight: Weight, heads: int) -> Weight:
    """Undo llama.cpp's converter, which interleaves each head's rotary halves for its own RoPE kernel."""
    if isinstance(weight, BlockQuantized):  # the same permutation of whole rows
        order = _unpermute(torch.arange(weight.shape[0]), heads)
        assert isinstance(order, torch.Tensor)
        return weight.take_rows(order)
    assert isinstance(weight, torch.Tensor), "a file's tensor is blocks or float"
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)
