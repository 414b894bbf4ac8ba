"""The Llama-family decoder (Llama, SmolLM2, Qwen2) over a paged KV cache.

Weights arrive under Hugging Face names (`model.layers.0.self_attn.q_proj.weight` ...) and are merged on load:
Q, K and V into one matrix, gate and up into another, so a layer costs four matrix multiplies. Which
implementation runs each op (torch, Triton, oneDNN-packed matrices) is fixed when the model is built: its
`ModelOps` (backend/executor/model/ops.py). Under `--quantization` a matrix may instead be kept quantized
(backend/executor/model/quantized_linear.py): it then multiplies itself, and the embedding looks up dequantized rows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from backend.executor.cpu.quant_blocks import Weight, as_float, concat_rows
from backend.executor.model.config import ModelConfig
from backend.executor.model.fused_step import FusedLayers
from backend.executor.model.layer import DecoderLayer, RMSNorm, add_norm, linear
from backend.executor.model.ops import ModelOps, ops_for
from backend.executor.model.quantized_linear import form_for, quantize
from backend.executor.model.rotary import Rotary
from backend.executor.model.vocabulary import vocabulary_for


class LlamaModel(nn.Module):
    """Decoder stack, final norm and output head. Each op runs as `ops` says: by default what `ops_for` picks
    for the device the model is built on (torch's default device, e.g. inside `with torch.device("cuda")`)
    and its dtype."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype = torch.float32,
        ops: ModelOps | None = None,
        rope_freq_factors: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.ops = ops or ops_for(str(torch.get_default_device()), dtype)
        self.embed_tokens = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size, dtype=dtype), requires_grad=False)
        self.rotary = Rotary(config, self.ops.rotary, rope_freq_factors)
        self.layers = nn.ModuleList(DecoderLayer(config, dtype, self.ops, self.rotary) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = (
            self.embed_tokens
            if config.tie_word_embeddings
            else nn.Parameter(torch.empty(config.vocab_size, config.hidden_size, dtype=dtype), requires_grad=False)
        )
        # The head in `ops.pack`'s form, after loading: a copy, since a tied embedding lookup needs the plain one.
        self.packed_head: torch.Tensor | None = None
        self.fused: FusedLayers | None = None  # the layers as one C++ call for decode steps, where they allow it

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        plan: object,
    ) -> torch.Tensor:
        """Hidden states `[T, hidden]` after the final norm; K/V of the new tokens are written to the caches.

        `plan` is this step's `self.ops.attention.plan(meta, block_size, dtype)`, shared by every layer.
        """
        embed = self.embed_tokens
        x = F.embedding(input_ids, embed) if isinstance(embed, torch.Tensor) else embed.rows(input_ids, self.dtype)
        if self.fused is not None:
            hidden = self.fused.run(x, positions, kv_caches, plan)
            if hidden is not None:
                return hidden
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, positions, kv_cache, plan)
        return add_norm(x, residual, self.norm, self.ops)[0]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits `[R, vocab]` for the rows of `hidden` the caller wants to sample from."""
        head = self.packed_head if self.packed_head is not None else self.lm_head
        return linear(self.ops, hidden, head).float()

    def load_weights(self, weights: Mapping[str, Weight], quantization: str = "none") -> None:
        """Copy tensors named as in transformers' LlamaForCausalLM / Qwen2ForCausalLM, merging projections; then
        bring the matrices into the form `ops.linear` reads. `quantization` (auto, none, int8, int4) says which
        matrices are kept quantized instead (`quantized_linear.form_for`); their float copy is never made."""
        self._copy_weights(weights, quantization)
        if self.ops.pack is not None:
            self._pack_matrices(self.ops.pack)
        self.fused = FusedLayers.build(self)

    @torch.inference_mode()
    def _copy_weights(self, weights: Mapping[str, Weight], quantization: str) -> None:
        own: dict[str, Weight] = {}
        for name, tensor in weights.items():
            own[_hf_to_own(name)] = tensor
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, DecoderLayer)
            p = f"layers.{i}."
            _place(layer, "qkv_proj", concat_rows([_take(own, p + s + ".weight") for s in ("q", "k", "v")]), quantization)
            if layer.qkv_bias is not None:
                _fill(layer.qkv_bias, torch.cat([as_float(_take(own, p + s + ".bias")) for s in ("q", "k", "v")]))
            _place(layer, "gate_up_proj", concat_rows([_take(own, p + "gate"), _take(own, p + "up")]), quantization)
            for name in ("o_proj", "down_proj"):
                _place(layer, name, _take(own, p + name), quantization)
            for name in ("input_norm", "post_norm"):
                _fill(getattr(layer, name).weight, as_float(_take(own, p + name)))
        embed = _take(own, "embed_tokens")
        if form_for(quantization, embed) == "dense":
            _fill(self.embed_tokens, as_float(embed))
        else:
            self._set_vocabulary("embed_tokens", vocabulary_for(embed))
            if self.config.tie_word_embeddings:
                self._set_vocabulary("lm_head", self.embed_tokens)
        _fill(self.norm.weight, as_float(_take(own, "norm")))
        head = own.pop("lm_head", None)
        if not self.config.tie_word_embeddings:
            if head is None:
                raise ValueError("the weights lack lm_head.weight and the config does not tie embeddings")
            if form_for(quantization, head) == "dense":
                _fill(self.lm_head, as_float(head))
            else:
                self._set_vocabulary("lm_head", vocabulary_for(head))
        if own:
            raise ValueError(f"unexpected weights: {', '.join(sorted(own)[:5])}")

    def _set_vocabulary(self, name: str, table: object) -> None:
        delattr(self, name)
        setattr(self, name, table)

    def _pack_matrices(self, pack: Callable[[torch.Tensor], torch.Tensor]) -> None:
        # Outside inference mode, so that the packed matrices are ordinary tensors like the parameters they replace.
        for layer in self.layers:
            for name in DecoderLayer.MATRICES:
                matrix = getattr(layer, name)
                if isinstance(matrix, torch.Tensor):
                    delattr(layer, name)
                    layer.register_buffer(name, pack(matrix), persistent=False)
        if isinstance(self.lm_head, torch.Tensor):
            self.packed_head = pack(self.lm_head)


_HF_NAMES = [
    (re.compile(r"^model\.embed_tokens\.weight$"), "embed_tokens"),
    (re.compile(r"^model\.norm\.weight$"), "norm"),
    (re.compile(r"^lm_head\.weight$"), "lm_head"),
    (re.compile(r"^model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)$"), r"layers.\1.\2.\3"),
    (re.compile(r"^model\.layers\.(\d+)\.self_attn\.o_proj\.weight$"), r"layers.\1.o_proj"),
    (re.compile(r"^model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight$"), r"layers.\1.\2"),
    (re.compile(r"^model\.layers\.(\d+)\.input_layernorm\.weight$"), r"layers.\1.input_norm"),
    (re.compile(r"^model\.layers\.(\d+)\.post_attention_layernorm\.weight$"), r"layers.\1.post_norm"),
]


def _hf_to_own(name: str) -> str:
    for pattern, repl in _HF_NAMES:
        if pattern.match(name):
            own = pattern.sub(repl, name)
            return own.replace(".down", ".down_proj") if own.endswith(".down") else own
    raise ValueError(f"unexpected weight {name!r}")


def _take(weights: dict[str, Weight], name: str) -> Weight:
    try:
        return weights.pop(name)
    except KeyError:
        raise ValueError(f"missing weight {name!r}") from None


def _place(module: nn.Module, name: str, weight: Weight, quantization: str) -> None:
    """Fill the float matrix `name`, or replace it by its quantized form (its float storage never touched)."""
    param = getattr(module, name)
    form = form_for(quantization, weight)
    if form == "dense":
        _fill(param, as_float(weight))
        return
    if tuple(param.shape) != tuple(weight.shape):
        raise ValueError(f"weight shape {tuple(weight.shape)} does not match the model's {tuple(param.shape)}")
    delattr(module, name)
    setattr(module, name, quantize(weight, form))


def _fill(param: torch.Tensor, value: torch.Tensor) -> None:
    if tuple(param.shape) != tuple(value.shape):
        raise ValueError(f"weight shape {tuple(value.shape)} does not match the model's {tuple(param.shape)}")
    param.copy_(value)
