"""Fixtures shared by the executor's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backend.executor.cpu import block_kernel, paged_kernel


def _through(path: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if path == "sdpa":
        monkeypatch.setattr(paged_kernel, "available", lambda: False)
        yield path
        return
    if not paged_kernel.available():
        pytest.skip("the C++ kernel does not build here")
    kernel = block_kernel.load()
    assert kernel is not None
    kernel.set_scalar_only(path == "portable kernel")  # one switch for every kernel of the extension
    try:
        yield path
    finally:
        kernel.set_scalar_only(False)


@pytest.fixture(params=["kernel", "portable kernel", "sdpa"])
def attention_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Runs a test through each decode attention: the C++ kernel (AVX2 where the CPU has it), its portable
    path, and torch's SDPA over gathered blocks (what serves where the kernel cannot build)."""
    yield from _through(request.param, monkeypatch)


@pytest.fixture(params=["kernel", "portable kernel"])
def kernel_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Runs a test through the C++ kernels' AVX2 paths (where the CPU has them) and their portable paths."""
    yield from _through(request.param, monkeypatch)
