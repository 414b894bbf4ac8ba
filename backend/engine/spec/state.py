"""What a sequence holds of speculative decoding: how well each source's drafts have done, and the extent of
its draft-model KV. A leaf: the sequence holds this state, and the speculator that updates it imports the
sequence.

Each sequence estimates, per source of drafts (prompt lookup's match length n, or the draft model), how likely
each drafted token is to be accepted, and drafts only as many tokens as pay for the query rows they add.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DRAFT_MODEL = 0  # the source key of a draft model's proposals (prompt lookup's are the match length, 1 to 4)
# What one more query row adds to a one-token decode step on CPU, as a share of that step: SmolLM2-135M on two
# cores, 6.0 ms for one row and 1.0 to 2.7 ms (0.17 to 0.45 of it, 0.3 on average) for each further one up to 7
# (`benchmarks.backend.decode_step --verify`, docs/benchmarks.md).
ROW_COST = 0.25
PRIOR = 0.6  # per-token acceptance assumed for a source of drafts not seen yet: two draft tokens
EWMA_WEIGHT = 0.3  # of the newest verification's per-token acceptance
RECOVERY = 0.05  # pull toward PRIOR on each step a source is found but not worth drafting: nothing is shut out for good


def worth_drafting(acceptance: float, limit: int, decoding: int = 1) -> int:
    """How many draft tokens pay, at most `limit`, when each is accepted with probability `acceptance` given
    the one before: the j-th adds acceptance ** j expected tokens for one more query row, and pays while that
    exceeds the row's cost in tokens of a step of `decoding` sequences (ROW_COST at one, rising toward 1)."""
    threshold = ROW_COST * decoding / (1 + ROW_COST * (decoding - 1))
    k = 0
    while k < limit and acceptance ** (k + 1) > threshold:
        k += 1
    return k


@dataclass(slots=True)
class DraftKV:
    """How much of one sequence's draft KV is valid, and in which block table it was written."""

    num_computed_tokens: int = 0
    block_table: list[int] | None = None


@dataclass(slots=True)
class DraftState:
    """One sequence's speculation: how well the drafts of each source have done, and the pending draft's source."""

    acceptance: dict[int, float] = field(default_factory=dict)  # per-token, exponentially weighted, by source
    source: int = DRAFT_MODEL
    draft_kv: DraftKV = field(default_factory=DraftKV)  # draft-model mode: its own KV's extent

    def draft_length(self, source: int, limit: int, decoding: int) -> int:
        """Tokens worth drafting from `source` now (0 lets its estimate recover a little toward PRIOR)."""
        self.source = source
        estimate = self.acceptance.get(source, PRIOR)
        k = worth_drafting(estimate, limit, decoding)
        if k == 0:
            self.acceptance[source] = estimate + RECOVERY * (PRIOR - estimate)
        return k

    def observe(self, drafted: int, accepted: int) -> None:
        """Fold in a verification: `accepted` of `drafted` tokens, one rejection after them unless all passed."""
        trials = accepted + (accepted < drafted)
        estimate = self.acceptance.get(self.source, PRIOR)
        self.acceptance[self.source] = estimate + EWMA_WEIGHT * (accepted / trials - estimate)
