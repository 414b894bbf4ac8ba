"""A Hugging Face folder (config.json, safetensors, tokenizer.json) converted to GGUF with the `gguf` package, for
the architectures the loader serves: tensor names, Q/K row order and metadata as llama.cpp's converter writes
them, each matrix in a type chosen per tensor.

    python -m backend.loading.gguf.writer HF_DIR OUT.gguf --type Q8_0
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize
from safetensors import safe_open

from backend.executor.model.config import ModelConfig, UnsupportedModelError
from backend.executor.model.families import FAMILIES
from backend.executor.model.rotary import rope_inv_freq
from backend.loading.gguf.weights import GLOBAL_NAMES, layer_names
from backend.loading.hf_vocab import GGUFVocab, vocab_from_hf_folder
from backend.loading.k_quantizer import K_TYPES, quantize_k

log = logging.getLogger(__name__)

# Chooses a tensor's type from its GGUF name and its shape (torch order, rows first).
TypeChoice = Callable[[str, tuple[int, ...]], Q]
# Encodes a float32 array in a type: bytes for a quantized type, the array itself for F32/F16.
Encoder = Callable[[np.ndarray, Q], np.ndarray]

_GGUF_ARCH = {"mixtral": "llama"}  # llama.cpp writes Mixtral as a llama file with experts
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# llama.cpp's quantizer, where a row's length is no multiple of a K-quant's 256: the 32-wide type of about its size.
_ROW_FALLBACK = {Q.Q2_K: Q.Q4_0, Q.Q3_K: Q.Q4_0, Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}
# K types no quantizer here writes: the type this backend computes natively of about the same size.
_NO_K_QUANTIZER = {Q.Q2_K: Q.Q4_0, Q.Q3_K: Q.Q4_0}
_CHUNK_ELEMENTS = 1 << 24  # rows quantized this many values at a time: numpy's quantizers copy several times


def _encodable(qtype: Q) -> bool:
    if qtype in (Q.F32, Q.F16) or qtype in K_TYPES:
        return True
    try:
        quantize(np.zeros((1, gguf.GGML_QUANT_SIZES[qtype][0]), dtype=np.float32), qtype)
    except NotImplementedError:
        return False
    return True


ENCODABLE_TYPES = frozenset(q for q in Q if q in gguf.GGML_QUANT_SIZES and _encodable(q))
RECIPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_M")


def encode_tensor(w: np.ndarray, qtype: Q) -> np.ndarray:
    """`w` (float32) in `qtype`, quantized a slab of rows at a time."""
    if qtype == Q.F32:
        return np.ascontiguousarray(w, dtype=np.float32)
    if qtype == Q.F16:
        return np.ascontiguousarray(w, dtype=np.float16)
    rows = w.reshape(-1, w.shape[-1])
    step = max(1, _CHUNK_ELEMENTS // w.shape[-1])
    encode = quantize_k if qtype in K_TYPES else quantize
    out = np.concatenate([encode(rows[i : i + step], qtype) for i in range(0, len(rows), step)])
    return out.reshape(*w.shape[:-1], -1)


def fit(qtype: Q, cols: int) -> Q:
    """`qtype`, or what llama.cpp's quantizer puts there when the row length is no multiple of its block, or a
    type the installed `gguf` can encode."""
    if qtype in _ROW_FALLBACK and cols % 256:
        qtype = _ROW_FALLBACK[qtype]
    if qtype not in ENCODABLE_TYPES:
        qtype = _NO_K_QUANTIZER.get(qtype, Q.F16)
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    return qtype if cols % block == 0 else Q.F16


def _kept_float(name: str, shape: tuple[int, ...]) -> bool:
    # Vectors, and a mixture of experts' router, which llama.cpp never quantizes.
    return len(shape) < 2 or name.endswith("ffn_gate_inp.weight")


def uniform(qtype: Q) -> TypeChoice:
    """Every matrix in `qtype` (fitted to its rows), vectors and routers F32."""
    return lambda name, shape: Q.F32 if _kept_float(name, shape) else fit(qtype, shape[-1])


def q4_k_m(num_layers: int, tied: bool) -> TypeChoice:
    """llama.cpp's Q4_K_M recipe: Q4_K, with Q6_K for the output head and for attn_v and ffn_down in the layers
    that matter most (the first and last eighth, every third between)."""

    def more_bits(layer: int) -> bool:
        return layer < num_layers // 8 or layer >= 7 * num_layers // 8 or (layer - num_layers // 8) % 3 == 2

    def choose(name: str, shape: tuple[int, ...]) -> Q:
        if _kept_float(name, shape):
            return Q.F32
        head = name == "output.weight" or (tied and name == "token_embd.weight")
        layer = re.match(r"^blk\.(\d+)\.(attn_v|ffn_down)", name)
        wide = head or bool(layer and more_bits(int(layer[1])))
        return fit(Q.Q6_K if wide else Q.Q4_K, shape[-1])

    return choose


def recipe(name: str, config: ModelConfig) -> TypeChoice:
    """The type choice `--type name` stands for."""
    if name == "Q4_K_M":
        return q4_k_m(config.num_layers, config.tie_word_embeddings)
    if name == "BF16":
        return lambda n, shape: Q.F32 if _kept_float(n, shape) else Q.BF16
    if name not in RECIPES:
        raise ValueError(f"unknown type {name!r}; choose one of {', '.join(RECIPES)}")
    return uniform(Q[name])


def hf_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the folder's safetensors shards, one at a time."""
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise UnsupportedModelError(f"{folder} has no *.safetensors files")
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safe_open handle is no dict)
                yield name, f.get_tensor(name)


def gguf_tensors(config: ModelConfig, tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, np.ndarray]]:
    """HF-named tensors as llama.cpp names and lays them out (float32), with the RoPE factor tensors it adds."""
    family = FAMILIES[config.architecture]
    names = {hf: name for name, hf in layer_names(config.architecture).items() if "{" not in name}
    to_gguf = {hf: name for name, hf in GLOBAL_NAMES.items()}
    for hf_name, tensor in _stack_experts(config, tensors):
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        layer = _LAYER.match(hf_name)
        if hf_name in to_gguf:
            name = to_gguf[hf_name]
        elif layer and layer[2] in names:
            name = f"blk.{layer[1]}.{names[layer[2]]}"
        else:
            raise UnsupportedModelError(f"no GGUF name for tensor {hf_name!r} of a {config.architecture} model")
        w = tensor.detach().float()
        if name.endswith("norm.weight"):
            w = w + family.GGUF_NORM_SHIFT
        if family.GGUF_PERMUTED_QK and name.endswith(("attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias")):
            w = _permute(w, config.num_heads if ".attn_q." in name else config.num_kv_heads)
        yield name, w.numpy()
    yield from _rope_tensors(config)


# A checkpoint's one matrix per expert (Qwen3-MoE's names, Mixtral's w1/w3/w2), and Mixtral's router.
_ONE_EXPERT = re.compile(
    r"^model\.layers\.(\d+)\.(?:mlp\.experts\.(\d+)\.(gate|up|down)_proj|block_sparse_moe\.experts\.(\d+)\.(w[123]))\.weight$")
_MIXTRAL_KINDS = {"w1": "gate", "w3": "up", "w2": "down"}


def _stack_experts(config: ModelConfig, tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Experts as llama.cpp stacks them, one tensor per kind and layer (`mlp.experts.gate_proj.weight`
    [experts, ffn, hidden]), from either of transformers' layouts: one matrix per expert (checkpoints) or
    transformers 5's fused gate|up in memory."""
    pending: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    for name, tensor in tensors:
        one = _ONE_EXPERT.match(name)
        if one:
            layer, expert, kind = one[1], int(one[2] or one[4]), one[3] or _MIXTRAL_KINDS[one[5]]
            group = pending.setdefault((layer, kind), {})
            group[expert] = tensor
            if len(group) == config.num_experts:
                yield f"model.layers.{layer}.mlp.experts.{kind}_proj.weight", torch.stack(
                    [group[e] for e in range(config.num_experts)])
                del pending[(layer, kind)]
        elif name.endswith("block_sparse_moe.gate.weight"):
            yield name.replace("block_sparse_moe.gate", "mlp.gate"), tensor
        elif name.endswith("mlp.experts.gate_up_proj"):
            gate, up = tensor.chunk(2, dim=1)
            yield name.removesuffix("gate_up_proj") + "gate_proj.weight", gate
            yield name.removesuffix("gate_up_proj") + "up_proj.weight", up
        elif name.endswith("mlp.experts.down_proj"):
            yield name + ".weight", tensor
        else:
            yield name, tensor
    if pending:
        raise UnsupportedModelError(f"experts missing from layer {min(pending)[0]}: expected {config.num_experts}")


def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's order of Q/K rows for llama-arch files: each head's rotary halves interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _rope_tensors(config: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type")
    if kind == "llama3":  # as divisors of the unscaled frequencies, which llama.cpp's RoPE applies itself
        plain = rope_inv_freq(dataclasses.replace(config, rope_scaling=None))
        yield "rope_freqs.weight", (plain / rope_inv_freq(config)).numpy().astype(np.float32)
    elif kind == "longrope":
        for part in ("short", "long"):
            yield f"rope_factors_{part}.weight", np.asarray(scaling[f"{part}_factor"], dtype=np.float32)


def add_metadata(writer: gguf.GGUFWriter, config: ModelConfig, raw: dict[str, Any]) -> None:
    """The `{arch}.*` keys llama.cpp's converter writes for this model."""
    writer.add_block_count(config.num_layers)
    writer.add_context_length(int(raw.get("max_position_embeddings", config.max_position_embeddings)))
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type")
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
    elif kind == "longrope":
        writer.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))
        if scaling.get("attention_factor") is not None:
            writer.add_rope_scaling_attn_factors(float(scaling["attention_factor"]))
    elif kind not in (None, "llama3"):  # llama3's scaling is a tensor (_rope_tensors)
        raise UnsupportedModelError(f"unsupported RoPE scaling {kind!r} for GGUF conversion")
    if config.sliding_window and config.architecture in ("phi3", "gemma2", "gemma3"):
        writer.add_sliding_window(config.sliding_window)
    if config.attn_logit_softcapping:
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
    if config.final_logit_softcapping:
        writer.add_final_logit_softcapping(config.final_logit_softcapping)
    if config.num_experts:
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_used)
        writer.add_expert_weights_norm(config.norm_topk_prob)
        if config.architecture != "mixtral":  # Mixtral's feed_forward_length is the experts'
            writer.add_expert_feed_forward_length(config.expert_intermediate_size)


def write_gguf(
    out: Path,
    raw_config: dict[str, Any],
    vocab: GGUFVocab,
    tensors: Iterable[tuple[str, np.ndarray]],
    choose: TypeChoice,
    *,
    encode: Encoder = encode_tensor,
) -> Path:
    """Write GGUF-named float tensors, each in the type `choose` picks, with the model's metadata and `vocab`."""
    config = ModelConfig.from_hf_config(raw_config)
    # Spilled to a temporary file past 256 MiB: one tensor at a time is in memory, not the whole model.
    writer = gguf.GGUFWriter(out, _GGUF_ARCH.get(config.architecture, config.architecture), use_temp_file=True)
    add_metadata(writer, config, raw_config)
    vocab.add_to(writer)
    for name, w in tensors:
        qtype = choose(name, tuple(w.shape))
        data = encode(w, qtype)
        writer.add_tensor(name, data, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def convert(folder: Path, out: Path, type_name: str = "F16", *, choose: TypeChoice | None = None) -> Path:
    """`folder` (config.json, safetensors, tokenizer.json) as a GGUF file; `choose` overrides `type_name`."""
    raw = json.loads((folder / "config.json").read_text())
    config = ModelConfig.from_hf_config(raw)
    vocab = vocab_from_hf_folder(folder, config.vocab_size, raw)
    tensors = gguf_tensors(config, hf_tensors(folder))
    return write_gguf(out, raw, vocab, tensors, choose or recipe(type_name, config))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Convert a Hugging Face folder to a GGUF file.")
    parser.add_argument("hf_dir", type=Path, help="folder with config.json, *.safetensors, tokenizer.json")
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    parser.add_argument("--type", default="F16", choices=RECIPES, help="matrix type (vectors stay F32)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    convert(args.hf_dir, args.out, args.type)
    print(args.out)


if __name__ == "__main__":
    main()
