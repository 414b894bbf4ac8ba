"""Logprobs of greedy tokens through the whole engine equal transformers' log-softmax (float path)."""

from __future__ import annotations

from pathlib import Path

import torch

from backend.engine.core import Engine, EngineConfig
from backend.engine.sampling_params import SamplingParams
from tests.backend.tiny_models import tiny_config, tiny_hf_model, write_hf_folder

PROMPT = [5, 17, 101, 33, 250, 7, 64]
TOKENS = 8
TOP = 5


def test_greedy_logprobs_match_transformers_log_softmax(tmp_path: Path) -> None:
    hf = tiny_hf_model(tiny_config("llama"), seed=11)
    engine = Engine(EngineConfig(write_hf_folder(hf, tmp_path / "tiny"), threads=1,
                                 kv_cache_memory=4 * 1024 * 1024))
    [result] = engine.generate_offline(
        [PROMPT], SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True, logprobs=TOP))
    assert len(result.logprobs) == len(result.token_ids) == TOKENS
    with torch.inference_mode():
        logits = hf(torch.tensor([PROMPT + result.token_ids[:-1]])).logits[0, len(PROMPT) - 1:]
    expected = torch.log_softmax(logits.float(), dim=-1)
    for step, entry in enumerate(result.logprobs):
        assert entry.token_id == result.token_ids[step] == int(expected[step].argmax())
        assert abs(entry.logprob - float(expected[step, entry.token_id])) < 1e-4
        top_values, top_ids = expected[step].topk(TOP)
        assert [t for t, _ in entry.top] == top_ids.tolist()
        assert max(abs(v - e) for (_, v), e in zip(entry.top, top_values.tolist(), strict=True)) < 1e-4
    assert engine.stats().kv_blocks_free == engine.stats().kv_blocks_total
