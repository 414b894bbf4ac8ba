"""The torch rotation gathers its factors once per step and gives the bits of Hugging Face's rotate_half."""

from __future__ import annotations

import pytest
import torch

from backend.executor.model import rotary

HEADS, KV_HEADS, HEAD_DIM = 6, 2, 16


def hf_rotation(qk: torch.Tensor, positions: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """transformers' `q * cos + rotate_half(q) * sin`, in the order its terms are summed there."""
    cos, sin = table[positions].to(qk.dtype).unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = qk.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_rotation_serves_every_layer_of_a_step_and_each_new_step_gets_its_own_rows(dtype: torch.dtype) -> None:
    table = rotary.build_cos_sin_cache(1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM), 512)
    rotation = rotary.StepRotation()
    gen = torch.Generator().manual_seed(0)
    for step_positions in ([0, 7, 300], [1, 8, 301, 44, 511], [9]):
        positions = torch.tensor(step_positions)
        for _layer in range(3):  # same positions tensor, fresh activations, as the model's layers pass them
            qk = torch.randn(len(step_positions), HEADS + KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
            q, k = rotation(positions, qk, HEADS, table)
            assert torch.equal(torch.cat((q, k), dim=1), hf_rotation(qk, positions, table))
            assert torch.equal(torch.cat(rotary.rotate(positions, qk, HEADS, table), dim=1), torch.cat((q, k), dim=1))
