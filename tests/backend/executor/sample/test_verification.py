"""Verifying draft tokens: greedy keeps the argmax run, sampling keeps the target distribution exactly."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import torch

from backend.engine.sampling_params import SamplingParams
from backend.executor.sample.batch import PenaltyState
from backend.executor.sample.verification import DraftVerifier, target_probs
from tests.backend.torch_threads import torch_threads

EOS = 7


@dataclass(slots=True)
class Drafted:
    """A decoding sequence with draft tokens, as the step sees it."""

    draft_token_ids: list[int]
    params: SamplingParams
    num_completion_tokens: int = 5
    token_ids: list[int] = field(default_factory=lambda: [1, 2, 3])
    generator: torch.Generator | None = None
    penalty_state: PenaltyState | None = None
    constraint: None = None
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 2

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def _rows(*probabilities: list[float]) -> torch.Tensor:
    return torch.tensor(probabilities).log()


def test_greedy_keeps_drafts_up_to_the_first_that_is_not_the_argmax_then_adds_the_argmax() -> None:
    verify = DraftVerifier([EOS])
    rows = _rows(*[[0.1, 0.6, 0.1, 0.1, 0.04, 0.02, 0.02, 0.02]] * 2, [0.1, 0.1, 0.6, 0.1, 0.04, 0.02, 0.02, 0.02])
    greedy = SamplingParams(temperature=0.0)
    assert verify(rows.clone(), [Drafted([1, 1], greedy)]).token_ids == [[1, 1, 2]]
    assert verify(rows.clone(), [Drafted([1, 3], greedy)]).token_ids == [[1, 1]]
    assert verify(rows.clone(), [Drafted([0, 1], greedy)]).token_ids == [[1]]


def test_min_tokens_keeps_eos_out_of_the_rows_before_it_is_reached() -> None:
    eos_first = [[0.01] * 7 + [0.93]] * 3
    seq = Drafted([EOS, EOS], SamplingParams(temperature=0.0, min_tokens=6, max_tokens=16))
    [tokens] = DraftVerifier([EOS])(_rows(*eos_first), [seq]).token_ids
    assert tokens[0] != EOS  # row 0 follows 5 completion tokens, fewer than min_tokens


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Thousands of tiny steps: on a busy machine two threads' barriers cost 20x the work."""
    with torch_threads(1):
        yield


@pytest.mark.usefixtures("one_thread")
def test_rejection_sampling_emits_tokens_with_the_target_probabilities() -> None:
    torch.manual_seed(7)
    p = [0.05, 0.3, 0.1, 0.25, 0.15, 0.05, 0.05, 0.05]
    verify = DraftVerifier([EOS])
    params = SamplingParams(temperature=1.0)
    logits = _rows(p, p)
    draws = 4000
    first = Counter(verify(logits.clone(), [Drafted([3], params)]).token_ids[0][0] for _ in range(draws))
    statistic = sum((first[t] - draws * q) ** 2 / (draws * q) for t, q in enumerate(p))
    df, z = len(p) - 1, 3.09  # p = 0.001
    assert statistic < df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    assert abs(first[3] / draws - 0.25) < 0.03  # the draft itself is kept exactly as often as p says


def test_target_probabilities_follow_top_k_and_top_p() -> None:
    logits = _rows([0.4, 0.3, 0.2, 0.1])
    top_k = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(top_k, torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0]]))
    top_p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.6))
    assert torch.allclose(top_p, torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0]]))


def test_sequences_without_drafts_sample_from_their_own_row() -> None:
    rows = _rows([0.9, 0.1], [0.1, 0.9], [0.9, 0.1], [0.2, 0.8], [0.3, 0.7])
    greedy = SamplingParams(temperature=0.0)
    out = DraftVerifier([EOS])(rows, [Drafted([], greedy), Drafted([1, 0], greedy), Drafted([], greedy)])
    assert out.token_ids == [[0], [1, 0, 1], [1]]
