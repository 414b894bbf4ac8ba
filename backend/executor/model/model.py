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
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from backend.executor.cpu.quant_blocks import Weight, as_float
from backend.executor.model.config import ModelConfig
from backend.executor.model.fused_step import FusedLayers
from backend.executor.model.layer import DecoderLayer, RMSNorm, add_norm, fill, linear, take
from backend.executor.model.ops import ModelOps, ops_for
from backend.executor.model.quantized_linear import form_for
from backend.executor.model.rotary import Rotary
from backend.executor.model.vocabulary import vocabulary_for


class LlamaModel(nn.Module):
    """Decoder stack, final norm and output head. Each op runs as `ops` says: by default what `ops_for` picks
    for the device the model is built on (torch's default device, e.g. inside `with torch.device("cuda")`)
    and its dtype. Other families (backend/executor/model/families/) subclass it with their own layer class
    and weight names."""

    LAYER: ClassVar[type[DecoderLayer]] = DecoderLayer
    # (HF name pattern, own name) pairs, tried in order.
    HF_NAMES: ClassVar[tuple[tuple[re.Pattern[str], str], ...]] = ()
    # GGUF layer tensor name (after `blk.{i}.`) -> HF name (after `model.layers.{i}.`) this family adds or overrides.
    GGUF_NAMES: ClassVar[dict[str, str]] = {}
    # llama.cpp's converter permuted the rows of Q and K (llama-arch files) for its own RoPE kernel.
    GGUF_PERMUTED_QK: ClassVar[bool] = True
    # What llama.cpp's converter added to every norm weight (Gemma's norms scale by 1 + weight); taken off at read.
    GGUF_NORM_SHIFT: ClassVar[float] = 0.0

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
        self.layers = nn.ModuleList(self.LAYER(config, dtype, self.ops, self.rotary) for _ in range(config.num_layers))
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
        x = self.embed(input_ids)
        if self.fused is not None:
            hidden = self.fused.run(x, positions, kv_caches, plan)
            if hidden is not None:
                return hidden
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, positions, kv_cache, plan)
        return add_norm(x, residual, self.norm, self.ops)[0]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows of `input_ids`, the residual stream's start."""
        embed = self.embed_tokens
        return F.embedding(input_ids, embed) if isinstance(embed, torch.Tensor) else embed.rows(input_ids, self.dtype)

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
            own[_hf_to_own(name, self.HF_NAMES + _HF_NAMES)] = tensor
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, DecoderLayer)
            layer.load(own, f"layers.{i}.", quantization)
        embed = take(own, "embed_tokens")
        if form_for(quantization, embed) == "dense":
            fill(self.embed_tokens, as_float(embed))
        else:
            self._set_vocabulary("embed_tokens", vocabulary_for(embed))
            if self.config.tie_word_embeddings:
                self._set_vocabulary("lm_head", self.embed_tokens)
        fill(self.norm.weight, as_float(take(own, "norm")))
        head = own.pop("lm_head", None)
        if not self.config.tie_word_embeddings:
            if head is None:
                raise ValueError("the weights lack lm_head.weight and the config does not tie embeddings")
            if form_for(quantization, head) == "dense":
                fill(self.lm_head, as_float(head))
            else:
                self._set_vocabulary("lm_head", vocabulary_for(head))
        if own:
            raise ValueError(f"unexpected weights: {', '.join(sorted(own)[:5])}")

    def _set_vocabulary(self, name: str, table: object) -> None:
        delattr(self, name)
        setattr(self, name, table)

    def _pack_matrices(self, pack: Callable[[torch.Tensor], torch.Tensor]) -> None:
        # Outside inference mode, so that the packed matrices are ordinary tensors like the parameters they replace.
        # Every module that names its matrices: the layers, and a mixture of experts' experts (families/moe.py).
        for module in self.layers.modules():
            for name in getattr(module, "MATRICES", ()):
                matrix = getattr(module, name)
                if isinstance(matrix, torch.Tensor):
                    delattr(module, name)
                    module.register_buffer(name, pack(matrix), persistent=False)
        if isinstance(self.lm_head, torch.Tensor):
            self.packed_head = pack(self.lm_head)


_HF_NAMES = (
    (re.compile(r"^model\.embed_tokens\.weight$"), "embed_tokens"),
    (re.compile(r"^model\.norm\.weight$"), "norm"),
    (re.compile(r"^lm_head\.weight$"), "lm_head"),
    (re.compile(r"^model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)$"), r"layers.\1.\2.\3"),
    (re.compile(r"^model\.layers\.(\d+)\.self_attn\.o_proj\.weight$"), r"layers.\1.o_proj"),
    (re.compile(r"^model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight$"), r"layers.\1.\2"),
    (re.compile(r"^model\.layers\.(\d+)\.input_layernorm\.weight$"), r"layers.\1.input_norm"),
    (re.compile(r"^model\.layers\.(\d+)\.post_attention_layernorm\.weight$"), r"layers.\1.post_norm"),
)


def _hf_to_own(name: str, names: tuple[tuple[re.Pattern[str], str], ...]) -> str:
    for pattern, repl in names:
        if pattern.match(name):
            own = pattern.sub(repl, name)
            return own.replace(".down", ".down_proj") if own.endswith(".down") else own
    raise ValueError(f"unexpected weight {name!r}")
