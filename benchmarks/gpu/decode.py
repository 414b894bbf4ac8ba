"""Decode step time of a Llama-3-8B-shaped model with random bf16 weights, Triton vs torch attention.

Every sequence decodes one token after ``context`` cached tokens. Achieved bandwidth counts the weight bytes
one step must read (every matrix, the output head, not the embedding table) over the step time, the
issue's measure, and separately with the KV bytes the attention reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from backend.executor.attention.base import AttentionBackend, AttentionMetadata
from backend.executor.attention.torch_attention import TorchAttention
from backend.executor.attention.triton_attention import TritonAttention
from backend.executor.cuda_graphs import DecodeGraphs
from backend.executor.model.config import ModelConfig
from backend.executor.model.model import LlamaModel
from backend.executor.model.ops import ModelOps, triton_ops
from benchmarks.gpu.timing import cuda_time_ms

LLAMA3_8B = ModelConfig(
    architecture="llama",
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling=None,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
    attention_bias=False,
)
BLOCK_SIZE = 16


def build_model(ops: ModelOps, config: ModelConfig = LLAMA3_8B) -> LlamaModel:
    """The model on the GPU with small random weights (allocated there directly, never on the host)."""
    with torch.device("cuda"):
        model = LlamaModel(config, dtype=torch.bfloat16, ops=ops)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
        else:
            param.data.normal_(0.0, 0.02)
    return model.eval()


def torch_attention_ops() -> ModelOps:
    """The GPU ops with the torch reference attention: the two paths share the fused elementwise ops."""
    return dataclasses.replace(triton_ops(), attention=TorchAttention())


def weight_bytes_per_step(model: LlamaModel) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.embed_tokens
    # The embedding table is gathered by row, not streamed; a tied output head would still be read whole.
    return total if model.config.tie_word_embeddings else total - embed.numel() * embed.element_size()


def _decode_inputs(
    config: ModelConfig, batch: int, context: int
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], AttentionMetadata]:
    blocks_per_seq = -(-context // BLOCK_SIZE)
    shape = (batch * blocks_per_seq + 1, BLOCK_SIZE, config.num_kv_heads, config.head_dim)
    caches = [
        (torch.randn(shape, dtype=torch.bfloat16, device="cuda"), torch.randn(shape, dtype=torch.bfloat16, device="cuda"))
        for _ in range(config.num_layers)
    ]
    tables = torch.arange(1, batch * blocks_per_seq + 1, dtype=torch.int32, device="cuda").view(batch, -1)
    positions = torch.full((batch,), context - 1, dtype=torch.int64, device="cuda")
    slots = tables[:, -1].long() * BLOCK_SIZE + (context - 1) % BLOCK_SIZE
    meta = AttentionMetadata(
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
        context_lens=torch.full((batch,), context, dtype=torch.int32, device="cuda"),
        block_tables=tables,
        slot_mapping=slots,
        max_query_len=1,
        max_context_len=context,
    )
    input_ids = torch.randint(0, config.vocab_size, (batch,), device="cuda")
    return input_ids, positions, caches, meta


def decode_step_ms(model: LlamaModel, batch: int, context: int) -> float:
    """Median time of one decode step (forward and logits) at ``batch`` sequences of ``context`` tokens."""
    input_ids, positions, caches, meta = _decode_inputs(model.config, batch, context)

    def step() -> None:
        # One plan per step, as the runner makes: per-step planning is part of the cost.
        plan = model.ops.attention.plan(meta, BLOCK_SIZE, model.dtype)
        hidden = model(input_ids, positions, caches, plan)
        model.compute_logits(hidden)

    return cuda_time_ms(step, iters=10, warmup=2)


def attention_ms(attention: AttentionBackend[Any], config: ModelConfig, batch: int, context: int) -> float:
    """Median time of one layer's KV write and attention for the same decode batch."""
    one_layer = dataclasses.replace(config, num_layers=1)
    _, _, caches, meta = _decode_inputs(one_layer, batch, context)
    k_cache, v_cache = caches[0]
    q = torch.randn(batch, config.num_heads, config.head_dim, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(batch, config.num_kv_heads, config.head_dim, dtype=torch.bfloat16, device="cuda")

    def layer() -> None:
        plan = attention.plan(meta, BLOCK_SIZE, torch.bfloat16)
        attention.write_kv(k, k, k_cache, v_cache, plan)
        attention.attend(q, k_cache, v_cache, plan, config.head_dim**-0.5)

    return cuda_time_ms(layer, iters=20)


def graph_step_ms(model: LlamaModel, batch: int, context: int) -> float:
    """Median replay time of the same decode step captured as a CUDA graph (a model with Triton attention)."""
    input_ids, positions, caches, meta = _decode_inputs(model.config, batch, context)
    graphs = DecodeGraphs(
        model, caches, max_batch=batch, max_blocks_per_seq=meta.block_tables.shape[1], buckets=(batch,)
    )
    return cuda_time_ms(lambda: graphs.replay(input_ids, positions, meta), iters=20)


def _gbps(num_bytes: int, ms: float) -> float:
    return round(num_bytes / (ms / 1e3) / 1e9, 1)


def kv_bytes_per_step(config: ModelConfig, batch: int, context: int) -> int:
    return 2 * batch * context * config.num_layers * config.num_kv_heads * config.head_dim * 2


def _attempt(measure: Callable[[], float]) -> tuple[float | None, str | None]:
    """A measurement, or the error that stopped it: one failing path must not hide the others' figures."""
    try:
        return measure(), None
    except Exception as exc:
        return None, repr(exc)[:300]
    finally:
        torch.cuda.empty_cache()


def _ratio(slow: float | None, fast: float | None) -> float | None:
    return round(slow / fast, 2) if slow is not None and fast is not None else None


def run(batches: tuple[int, ...] = (1, 16, 128), context: int = 512, copy_gbps: float | None = None) -> list[dict]:
    """One row per batch size: eager step times of both paths, their ratio, achieved bandwidth, and the
    Triton step replayed as a CUDA graph. A path that fails leaves None and its error in the row."""
    model = build_model(triton_ops())
    torch_model = build_model(torch_attention_ops())
    weights = weight_bytes_per_step(model)
    rows = []
    for batch in batches:
        timed = {
            "triton_step_ms": _attempt(partial(decode_step_ms, model, batch, context)),
            "torch_step_ms": _attempt(partial(decode_step_ms, torch_model, batch, context)),
            "graph_step_ms": _attempt(partial(graph_step_ms, model, batch, context)),
            "triton_attention_layer_ms": _attempt(
                partial(attention_ms, TritonAttention(), model.config, batch, context)
            ),
            "torch_attention_layer_ms": _attempt(partial(attention_ms, TorchAttention(), model.config, batch, context)),
        }
        row: dict[str, float | int | str | None] = {"batch": batch, "context": context}
        for name, (ms, error) in timed.items():
            row[name] = round(ms, 4) if ms is not None else None
            if error is not None:
                row[name.replace("_ms", "_error")] = error
        triton_ms, graph_ms = timed["triton_step_ms"][0], timed["graph_step_ms"][0]
        row["torch_over_triton"] = _ratio(timed["torch_step_ms"][0], triton_ms)
        row["attention_torch_over_triton"] = _ratio(
            timed["torch_attention_layer_ms"][0], timed["triton_attention_layer_ms"][0]
        )
        kv = kv_bytes_per_step(model.config, batch, context)
        for prefix, ms in (("", triton_ms), ("graph_", graph_ms)):
            if ms is None:
                continue
            row[f"{prefix}weight_gbps"] = _gbps(weights, ms)
            row[f"{prefix}weight_plus_kv_gbps"] = _gbps(weights + kv, ms)
            if copy_gbps:
                row[f"{prefix}weight_fraction_of_copy"] = round(_gbps(weights, ms) / copy_gbps, 3)
        rows.append(row)
    return rows
