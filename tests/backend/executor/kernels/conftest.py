"""Kernel tests run under Triton's CPU interpreter, or on a GPU when TIDEGATE_KERNEL_DEVICE=cuda.

triton decides between compiling and interpreting when ``@triton.jit`` decorates a function, reading
TRITON_INTERPRET at that moment: for triton's own helpers (tl.sum, tl.max) when triton.language is first
imported (gluon's when it is), for ours when backend.executor.kernels is. So the variable is set only around those two imports and then
restored: kernels decorated later by any other code in the process compile as usual.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

DEVICE = os.environ.get("TIDEGATE_KERNEL_DEVICE", "cpu")


def _import_kernels_interpreted() -> str | None:
    """Import backend.executor.kernels for the interpreter; return why that is impossible in this process, or None."""
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        # gluon is imported lazily by the first launch and checks the variable then: import it now.
        import triton.experimental.gluon  # noqa: F401
        from triton.language import standard
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(standard.sum, InterpretedFunction):
            return (
                "triton was imported before tests/backend/executor/kernels/conftest.py could select its CPU "
                "interpreter; run the kernel tests in their own process: pytest tests/backend/executor/kernels"
            )
        loaded = sys.modules.get("backend.executor.kernels.kv_write")
        if loaded is not None and not isinstance(loaded._kv_write_kernel, InterpretedFunction):
            # With them goes the attention backend, which bound the compiled kernels at its import.
            stale = ("backend.executor.kernels", "backend.executor.attention.triton_attention")
            for name in [n for n in sys.modules if n in stale or n.startswith("backend.executor.kernels.")]:
                del sys.modules[name]
        importlib.import_module("backend.executor.kernels")
        return None
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


_UNUSABLE = _import_kernels_interpreted() if DEVICE == "cpu" else None


@pytest.fixture(autouse=True)
def _interpreter_ready() -> None:
    # Fail these tests, with the reason, rather than stop the collection of everyone else's.
    if _UNUSABLE is not None:
        pytest.fail(_UNUSABLE)


@pytest.fixture
def device() -> torch.device:
    """Where the kernels run: CPU (interpreted) in CI, CUDA in benchmarks/gpu/check.sh."""
    return torch.device(DEVICE)


@pytest.fixture
def rng() -> torch.Generator:
    """A seeded CPU generator, so every failure reproduces."""
    return torch.Generator().manual_seed(1234)
