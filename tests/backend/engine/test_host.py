"""The allocator tuning applies on glibc Linux; work handed to a passing thread returns or raises in the caller;
collection pauses around a load, and what a loaded server holds is frozen out of later collections."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading

import pytest

from backend.engine.host import (
    KEEP_FREED_BYTES,
    collector_paused,
    freeze_loaded_objects,
    in_passing_thread,
    keep_freed_memory,
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_tuning_applies_and_is_idempotent() -> None:
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True


# In a fresh interpreter: 256 heap blocks of 1 MiB, touched, then freed; the resident growth left behind.
_FREED_PROBE = """
import ctypes, sys
from backend.engine.host import keep_freed_memory
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    status = open("/proc/self/status").read().splitlines()
    return int(next(line.split()[1] for line in status if line.startswith("VmRSS:"))) * 1024
assert keep_freed_memory()
before = rss()
blocks = [libc.malloc(1 << 20) for _ in range(256)]
for block in blocks:
    ctypes.memset(block, 1, 1 << 20)
for block in reversed(blocks):
    libc.free(block)
print(rss() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_freed_memory_beyond_the_cap_goes_back_to_the_kernel() -> None:
    done = subprocess.run([sys.executable, "-c", _FREED_PROBE], capture_output=True, text=True, check=True)
    kept = int(done.stdout)
    assert kept <= KEEP_FREED_BYTES + (8 << 20)  # the cap, and the probe's own few pages
    assert kept >= 0


# In a fresh interpreter: eight threads each allocate at once; glibc's statistics list the arenas they used.
_ARENA_PROBE = """
import ctypes, threading
from backend.engine.host import keep_freed_memory
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
assert keep_freed_memory(arenas=2)
barrier = threading.Barrier(8)
def work():
    block = libc.malloc(1 << 16)
    barrier.wait()  # all eight hold a block at once: none could have passed its arena on
    libc.free(block)
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc.malloc_stats()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_threads_share_at_most_the_arenas_asked_for() -> None:
    done = subprocess.run([sys.executable, "-c", _ARENA_PROBE], capture_output=True, text=True, check=True)
    arenas = [line for line in done.stderr.splitlines() if line.startswith("Arena ")]
    assert 1 <= len(arenas) <= 2, done.stderr


def test_passing_thread_returns_the_result_from_another_thread() -> None:
    caller = threading.get_ident()
    assert in_passing_thread(threading.get_ident) != caller


def test_passing_thread_raises_in_the_caller() -> None:
    def fail() -> None:
        raise ValueError("bad model")

    with pytest.raises(ValueError, match="bad model"):
        in_passing_thread(fail)


def test_collection_pauses_inside_and_resumes_after_even_on_error() -> None:
    assert gc.isenabled()
    with pytest.raises(ValueError, match="bad model"), collector_paused():
        assert not gc.isenabled()
        raise ValueError("bad model")
    assert gc.isenabled()


def test_frozen_objects_are_out_of_the_collections_reach() -> None:
    loaded = [[i] for i in range(1000)]
    try:
        freeze_loaded_objects()
        assert gc.get_freeze_count() >= len(loaded)
    finally:
        gc.unfreeze()
