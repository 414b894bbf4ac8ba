"""Decode CUDA graphs replay the eager step exactly (GPU only)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backend import Engine, EngineConfig, SamplingParams
from backend.executor.attention.base import AttentionMetadata
from backend.executor.cuda_graphs import DecodeGraphs
from backend.executor.model.config import ModelConfig
from backend.executor.model.model import LlamaModel
from backend.executor.model.ops import triton_ops
from backend.loading.loader import load_model

TINY = ModelConfig(
    architecture="llama", vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=32, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
    max_position_embeddings=1024, tie_word_embeddings=True, attention_bias=False,
)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_replay_matches_eager_decode_and_pads_to_bucket() -> None:
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaModel(TINY, dtype=torch.float16, ops=triton_ops())
    for p in model.parameters():
        p.data.normal_(0.0, 0.05)
    block_size, blocks_per_seq, batch = 16, 4, 3
    shape = (batch * blocks_per_seq + 1, block_size, TINY.num_kv_heads, TINY.head_dim)
    caches = [(torch.randn(shape, device="cuda").half(), torch.randn(shape, device="cuda").half()) for _ in range(2)]
    eager_caches = [(k.clone(), v.clone()) for k, v in caches]
    context = torch.tensor([5, 40, 17], dtype=torch.int32, device="cuda")
    tables = torch.arange(1, batch * blocks_per_seq + 1, dtype=torch.int32, device="cuda").view(batch, -1)
    positions = context.long() - 1
    slots = tables.long().gather(1, (positions // block_size)[:, None]).squeeze(1) * block_size + positions % block_size
    meta = AttentionMetadata(
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
        context_lens=context, block_tables=tables, slot_mapping=slots, max_query_len=1, max_context_len=40,
    )
    input_ids = torch.tensor([7, 300, 42], device="cuda")

    graphs = DecodeGraphs(model, caches, max_batch=8, max_blocks_per_seq=blocks_per_seq, buckets=(1, 4, 8))
    assert graphs.bucket_for(batch) == 4
    replayed = graphs.replay(input_ids, positions, meta).clone()
    plan = model.ops.attention.plan(meta, block_size, torch.float16)
    eager = model.compute_logits(model(input_ids, positions, eager_caches, plan))

    # The bucket pads 3 rows to 4, so matmuls may pick other algorithms: equal up to fp16 rounding.
    torch.testing.assert_close(replayed, eager, atol=1e-2, rtol=1e-2)
    for (k, v), (ek, ev) in zip(caches, eager_caches, strict=True):
        torch.testing.assert_close(k, ek, atol=1e-2, rtol=1e-2)  # same new rows written, nothing else touched
        torch.testing.assert_close(v, ev, atol=1e-2, rtol=1e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_engine_with_decode_graphs_gives_the_eager_tokens(model_path: Path) -> None:
    # float32, so that padding a batch up to its bucket cannot flip a near-tie between two tokens.
    loaded = load_model(model_path, device="cuda", dtype=torch.float32)
    prompts = [loaded.tokenizer.encode(t) for t in ("The capital of France is", "1, 2, 3,", "Once upon a time")]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    results = {}
    for graphs in (True, False):
        config = EngineConfig(
            model_path, device="cuda", dtype="float32", kv_cache_memory=256 << 20, max_num_seqs=8, cuda_graphs=graphs
        )
        engine = Engine(config, loaded=loaded)
        assert (engine.runner.graphs is not None) is graphs
        results[graphs] = [c.token_ids for c in engine.generate_offline(prompts, params)]
    assert results[True] == results[False]
