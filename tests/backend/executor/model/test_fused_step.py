"""The C++ decode stack gives the Python layer loop's bits, and steps it cannot run keep the loop."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from backend.executor.attention.base import AttentionMetadata
from backend.executor.model.fused_step import FusedLayers
from backend.executor.model.model import LlamaModel
from backend.loading.loader import load_model
from tests.backend.model_harness import BLOCK_SIZE, make_kv_caches, paged_greedy, plan_for
from tests.backend.tiny_models import tiny_config, tiny_hf_model, write_hf_folder


@pytest.fixture(scope="module")
def model(model_path: Path) -> LlamaModel:
    """The default model as `tidegate backend` serves it: its Q4_1 matrices kept in blocks (`auto`)."""
    model = load_model(model_path, quantization="auto").model
    if model.fused is None:
        pytest.skip("the C++ kernels do not build here, or the model is not kept in GGML blocks")
    return model


@contextmanager
def python_loop(model: LlamaModel) -> Iterator[None]:
    fused, model.fused = model.fused, None
    try:
        yield
    finally:
        model.fused = fused


@contextmanager
def qkv_biases(model: LlamaModel) -> Iterator[None]:
    """Qwen2's biases on Q, K and V, random, in every layer of the shared model for the test's length."""
    fused, gen = model.fused, torch.Generator().manual_seed(0)
    for layer in model.layers:
        layer.qkv_bias = torch.randn(layer.q_size + 2 * layer.kv_size, generator=gen) * 0.1
    model.fused = FusedLayers.build(model)
    try:
        yield
    finally:
        for layer in model.layers:
            layer.qkv_bias = None
        model.fused = fused


def step_meta(tables: list[list[int]], computed: list[int], new: list[int]) -> AttentionMetadata:
    """Sequences with `computed` tokens in their caches, each adding `new` tokens this step."""
    slots = [tables[i][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
             for i in range(len(tables)) for p in range(computed[i], computed[i] + new[i])]
    ctx = [c + n for c, n in zip(computed, new, strict=True)]
    return AttentionMetadata(
        query_start_loc=torch.tensor([0, *new]).cumsum(0).to(torch.int32),
        context_lens=torch.tensor(ctx, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (max(map(len, tables)) - len(t)) for t in tables], dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        max_query_len=max(new),
        max_context_len=max(ctx),
    )


def run(model: LlamaModel, ids: list[int], positions: list[int], caches: list[Any], meta: AttentionMetadata
        ) -> torch.Tensor:
    hidden: torch.Tensor = model(torch.tensor(ids), torch.tensor(positions), caches, plan_for(model, meta))
    return hidden


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("bias", [False, True], ids=["llama", "qkv-bias"])
def test_a_step_of_decodes_and_a_verification_gives_the_loops_bits(model: LlamaModel, bias: bool) -> None:
    with qkv_biases(model) if bias else nullcontext():
        _decode_and_verify(model)


def _decode_and_verify(model: LlamaModel) -> None:
    prompts = [list(range(1000, 1040)), list(range(2000, 2071))]
    tables = [[9, 2, 7, 0], [1, 8, 4, 6, 3, 5]]  # scattered, out of order
    caches = make_kv_caches(model, 10)
    for table, prompt in zip(tables, prompts, strict=True):  # prefill chunks: the Python loop
        assert model.fused is not None
        meta = step_meta([table], [0], [len(prompt)])
        assert model.fused.run(torch.zeros(len(prompt), model.config.hidden_size), torch.arange(len(prompt)),
                               caches, plan_for(model, meta)) is None
        run(model, prompt, list(range(len(prompt))), caches, meta)
    # one decode and one verification of three drafts, as a speculative step sends them
    ids, positions = [5, 17, 18, 19, 20], [40, 71, 72, 73, 74]
    meta = step_meta(tables, [40, 71], [1, 4])
    loop_caches = [(k.clone(), v.clone()) for k, v in caches]
    assert model.fused is not None
    stack, calls = model.fused._stack, []
    model.fused._stack = SimpleNamespace(run=lambda *args: calls.append(1) or stack.run(*args))
    try:
        fused = run(model, ids, positions, caches, meta)
    finally:
        model.fused._stack = stack
    assert calls == [1]  # the step went through the stack
    with python_loop(model):
        loop = run(model, ids, positions, loop_caches, meta)
    assert torch.equal(fused, loop)
    for (k, v), (lk, lv) in zip(caches, loop_caches, strict=True):
        assert torch.equal(k, lk) and torch.equal(v, lv)


def test_greedy_decoding_is_the_same_with_and_without_the_stack(model: LlamaModel) -> None:
    prompt = [1, 504, 3458, 282, 4649, 314]  # "The capital of France is", as the tokenizer reads it
    fused = paged_greedy(model, prompt, 12)
    with python_loop(model):
        assert paged_greedy(model, prompt, 12) == fused


def test_models_outside_its_reach_keep_the_loop(tmp_path: Any) -> None:
    tiny = load_model(write_hf_folder(tiny_hf_model(tiny_config(), seed=1), tmp_path))
    assert tiny.model.fused is None  # float matrices (F.linear or oneDNN), not the block kernel
