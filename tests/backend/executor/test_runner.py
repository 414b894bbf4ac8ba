"""The runner's step inputs: every new token's id, position and cache slot, and the rows that sample."""

from __future__ import annotations

from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Sequence
from backend.executor.runner import StepInputs

BLOCK = 4


def make_seq(tokens: int, computed: int, blocks: list[int], drafts: list[int] | None = None) -> Sequence:
    seq = Sequence("r", list(range(100, 100 + tokens)), SamplingParams())
    seq.num_computed_tokens = computed
    seq.block_table = blocks
    seq.draft_token_ids = drafts or []
    return seq


def test_a_prefill_chunk_across_blocks_a_decode_and_a_drafted_sequence() -> None:
    chunk = make_seq(tokens=10, computed=2, blocks=[7, 3, 9])  # tokens 2..7 this step; 8, 9 in the next
    decode = make_seq(tokens=6, computed=5, blocks=[1, 4])
    drafted = make_seq(tokens=3, computed=2, blocks=[5, 2], drafts=[55, 66])
    step = StepInputs.build([chunk, decode, drafted], [6, 1, 3], BLOCK)

    assert step.input_ids == [102, 103, 104, 105, 106, 107, 105, 102, 55, 66]
    assert step.positions == [2, 3, 4, 5, 6, 7, 5, 2, 3, 4]
    # slot = block id x 4 + offset: positions 2, 3 in block 7, 4..7 in block 3; 5 in block 4; 2, 3 in 5, 4 in 2
    assert step.slots == [30, 31, 12, 13, 14, 15, 17, 22, 23, 8]
    assert step.query_start_loc == [0, 6, 7, 10]
    assert step.context_lens == [8, 6, 5]
    assert step.widest == 3 and step.block_tables == [7, 3, 9, 1, 4, 0, 5, 2, 0]
    # the chunk is mid-prefill and does not sample; the drafted sequence samples after its token and each draft
    assert step.sampling == [1, 2]
    assert step.logits_rows == [6, 7, 8, 9]


def test_a_decode_only_step_samples_every_row_in_order() -> None:
    seqs = [make_seq(tokens=n, computed=n - 1, blocks=[n, n + 10]) for n in (5, 6, 8)]
    step = StepInputs.build(seqs, [1, 1, 1], BLOCK)
    assert step.positions == [4, 5, 7]
    assert step.slots == [15 * 4 + 0, 16 * 4 + 1, 18 * 4 + 3]
    assert step.sampling == [0, 1, 2] and step.logits_rows == [0, 1, 2]


def test_a_step_of_prefill_chunks_only_samples_no_row() -> None:
    step = StepInputs.build([make_seq(tokens=9, computed=0, blocks=[2, 6, 1])], [5], BLOCK)
    assert step.slots == [8, 9, 10, 11, 24] and step.sampling == [] and step.logits_rows == []
