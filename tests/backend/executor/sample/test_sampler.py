"""Sampler: greedy, top-k/top-p, seeds independent of the batch, min_tokens masking EOS and stop tokens."""

from __future__ import annotations

import torch

from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Sequence
from backend.executor.sample.sampler import Sampler, argmax_rows

EOS = 2
VOCAB = 50


def make_seq(params: SamplingParams, generated: int = 0) -> Sequence:
    seq = Sequence("r", [5, 6, 7], params)
    seq.token_ids += [9] * generated
    return seq


def logits_for(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed))


def test_greedy_picks_the_argmax_of_each_row() -> None:
    logits = logits_for(4)
    seqs = [make_seq(SamplingParams(temperature=0.0)) for _ in range(4)]
    assert Sampler([EOS])(logits.clone(), seqs).token_ids == logits.argmax(-1).tolist()


def test_argmax_rows_picks_as_torch_does_the_first_of_a_tie_and_past_infinities() -> None:
    logits = logits_for(3)
    logits[1, 3] = logits[1, 7] = 100.0
    logits[2] = float("-inf")
    logits[2, 9] = -50.0
    assert argmax_rows(logits) == logits.argmax(-1).tolist() == [argmax_rows(logits)[0], 3, 9]


def test_the_greedy_fast_path_picks_what_the_general_sampler_picks() -> None:
    logits = logits_for(4, seed=7)
    plain = [make_seq(SamplingParams(temperature=0.0)) for _ in range(4)]
    # one row that reports logprobs sends the whole step through the general path
    general = [*plain[:3], make_seq(SamplingParams(temperature=0.0, logprobs=0))]
    out = Sampler([EOS])(logits.clone(), general)
    assert out.logprobs[3] is not None
    assert Sampler([EOS])(logits.clone(), plain).token_ids == out.token_ids == logits.argmax(-1).tolist()


def test_min_tokens_forbids_eos_and_stop_tokens_until_reached() -> None:
    logits = torch.zeros(2, VOCAB)
    logits[:, EOS] = 10.0
    logits[:, 7] = 9.0
    logits[:, 3] = 8.0
    early = make_seq(SamplingParams(temperature=0.0, min_tokens=4, stop_token_ids=[7]), generated=1)
    late = make_seq(SamplingParams(temperature=0.0, min_tokens=4, stop_token_ids=[7]), generated=4)
    assert Sampler([EOS])(logits, [early, late]).token_ids == [3, EOS]


def test_top_k_one_and_tiny_top_p_reduce_to_greedy() -> None:
    logits = logits_for(2, seed=3)
    seqs = [
        make_seq(SamplingParams(temperature=1.5, top_k=1, seed=1)),
        make_seq(SamplingParams(temperature=1.5, top_p=1e-6, seed=1)),
    ]
    for _ in range(5):
        assert Sampler([EOS])(logits.clone(), seqs).token_ids == logits.argmax(-1).tolist()


def test_top_k_never_draws_outside_the_k_best() -> None:
    row = logits_for(1, seed=4)
    allowed = set(torch.topk(row[0], 3).indices.tolist())
    seq = make_seq(SamplingParams(temperature=5.0, top_k=3, seed=11))
    drawn = {Sampler([EOS])(row.clone(), [seq]).token_ids[0] for _ in range(200)}
    assert drawn <= allowed and len(drawn) > 1


def test_top_p_keeps_only_the_head_that_reaches_the_mass() -> None:
    row = torch.full((1, VOCAB), -20.0)
    row[0, 10], row[0, 11], row[0, 12] = 5.0, 4.9, 0.0  # the first two hold almost all the mass
    seq = make_seq(SamplingParams(temperature=1.0, top_p=0.9, seed=5))
    drawn = {Sampler([EOS])(row.clone(), [seq]).token_ids[0] for _ in range(200)}
    assert drawn == {10, 11}


def test_seeded_rows_draw_the_same_whatever_else_is_in_the_batch() -> None:
    def draws(batch_logits: torch.Tensor, row: int, others: int) -> list[int]:
        target = make_seq(SamplingParams(temperature=1.0, seed=42))
        seqs = [make_seq(SamplingParams(temperature=1.0, seed=s)) for s in range(others)]
        seqs.insert(row, target)
        sampler = Sampler([EOS])
        return [sampler(batch_logits.clone(), seqs).token_ids[row] for _ in range(10)]

    target_row = logits_for(1, seed=9)
    alone = draws(target_row, 0, 0)
    crowded = torch.cat([logits_for(2, seed=1), target_row, logits_for(3, seed=2)])
    assert draws(crowded, 2, 5) == alone
