"""On the machines CI runs on (x86_64 Linux) the CPU kernels must build: elsewhere the kernel tests skip and the
executor falls back to torch, which would keep CI green over a broken kernel source."""

from __future__ import annotations

import platform
import sys

import pytest

from backend.executor.cpu import block_kernel


@pytest.mark.skipif(
    not (sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")),
    reason="the kernels are required only on x86_64 Linux",
)
@pytest.mark.timeout(900)  # CI's `make model` builds first; run alone, this test may pay the whole build
def test_the_kernels_build_on_x86_64_linux() -> None:
    assert block_kernel.load() is not None, (
        "the CPU kernels failed to build, so every block-kernel test skipped and the executor fell back to torch; "
        "run `python -m backend.executor.cpu.block_kernel build` to see the compiler's error"
    )
