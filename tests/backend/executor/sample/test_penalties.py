"""Penalties and logit_bias over a batch equal transformers' logits processors (and OpenAI's formula where
transformers has none), row by row, and their token counts follow each sampled token."""

from __future__ import annotations

import torch
from transformers import RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor

from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Sequence
from backend.executor.sample.sampler import Sampler

VOCAB = 64
EOS = 63


def seq_with(params: SamplingParams, prompt: list[int], output: list[int]) -> Sequence:
    seq = Sequence("r", prompt, params)
    seq.token_ids += output
    return seq


def batch_logits(rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(7)) * 3


def openai_penalties(logits: torch.Tensor, output: list[int], presence: float, frequency: float) -> torch.Tensor:
    """OpenAI's documented formula: mu[j] - c[j] * frequency - (c[j] > 0) * presence."""
    counts = torch.bincount(torch.tensor(output, dtype=torch.int64), minlength=VOCAB).float()
    return logits - counts * frequency - (counts > 0).float() * presence


def test_a_batch_of_penalized_rows_equals_the_reference_processors_row_by_row() -> None:
    prompts = [[1, 2, 3, 3], [4, 5], [6, 7, 8], [9]]
    outputs = [[3, 10, 10, 11], [5, 5, 20], [30], [9, 9, 9]]
    params = [
        SamplingParams(temperature=0.0, repetition_penalty=1.3),
        SamplingParams(temperature=0.0, presence_penalty=0.7, frequency_penalty=0.4),
        SamplingParams(temperature=0.0),  # unpenalized rows are left alone
        SamplingParams(temperature=0.0, repetition_penalty=0.8, frequency_penalty=-0.5,
                       logit_bias={9: -100.0, 40: 25.0}),
    ]
    seqs = [seq_with(p, pr, o) for p, pr, o in zip(params, prompts, outputs, strict=True)]
    logits = batch_logits(4)
    expected = logits.clone()
    for row in range(4):
        ids = torch.tensor([prompts[row] + outputs[row]])
        ref = RepetitionPenaltyLogitsProcessor(params[row].repetition_penalty)(ids, expected[row:row + 1].clone())
        ref = openai_penalties(ref[0], outputs[row], params[row].presence_penalty, params[row].frequency_penalty)
        if params[row].logit_bias:
            bias = SequenceBiasLogitsProcessor({(t,): b for t, b in params[row].logit_bias.items()})
            ref = bias(ids, ref.unsqueeze(0))[0]
        expected[row] = ref
    out = Sampler([EOS])(logits, seqs)
    torch.testing.assert_close(logits, expected)  # the sampler transforms the step's logits in place
    assert out.token_ids == expected.argmax(-1).tolist()


def test_counts_follow_the_sampled_tokens_without_rescanning() -> None:
    seq = seq_with(SamplingParams(temperature=0.0, frequency_penalty=2.0), [1, 2], [])
    sampler = Sampler([EOS])
    logits = torch.zeros(1, VOCAB)
    logits[0, 12], logits[0, 13] = 5.0, 4.0
    first = sampler(logits.clone(), [seq]).token_ids[0]
    seq.token_ids.append(first)  # what the engine does with each sampled token
    second = sampler(logits.clone(), [seq]).token_ids[0]
    assert (first, second) == (12, 13)  # 12 paid its frequency penalty once it was generated
    assert seq.penalty_state is not None and seq.penalty_state.counts[12] == 1


def test_logit_bias_can_force_and_forbid_tokens_of_a_sampled_row() -> None:
    logits = batch_logits(2)
    best = int(logits[1].argmax())
    seq = seq_with(SamplingParams(temperature=1.0, seed=3, logit_bias={17: 100.0}), [1], [])
    banned = seq_with(SamplingParams(temperature=0.0, logit_bias={best: -100.0}), [1], [])
    out = Sampler([EOS])(logits, [seq, banned])
    assert out.token_ids[0] == 17 and out.token_ids[1] != best


def test_logprobs_are_the_log_softmax_of_the_penalized_logits() -> None:
    seq = seq_with(SamplingParams(temperature=0.0, presence_penalty=1.5, logprobs=3), [1], [5])
    logits = batch_logits(1)
    expected = torch.log_softmax(openai_penalties(logits[0], [5], 1.5, 0.0), -1)
    entry = Sampler([EOS])(logits, [seq]).logprobs[0]
    assert entry is not None
    assert entry.token_id == int(expected.argmax())
    assert abs(entry.logprob - float(expected.max())) < 1e-6
    assert [t for t, _ in entry.top] == expected.topk(3).indices.tolist()
