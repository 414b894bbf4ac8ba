"""torch's CPU thread count set for a block of a test, and given back after it whatever happens."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
