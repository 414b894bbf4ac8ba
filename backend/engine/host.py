"""How the host process is set up for the step loop: where freed memory goes, and which threads run torch.

Memory. Every step allocates and frees the same large activations (a few MB to a few tens of MB each). glibc returns
allocations above its mmap threshold, and the top of the heap above its trim threshold, to the kernel as soon
as they are freed, so the next step page-faults all of it in again. Under a hypervisor each fault is dear: on
the 2-core VM of docs/benchmarks.md that made a decode step of 32 sequences up to half again as long. A step's
working set fits in KEEP_FREED_BYTES: keeping every freed byte instead (no trim at all) held 135 MiB more at
a Qwen2.5-0.5B server's peak for no step time measured (docs/engine.md). Each heap (arena) keeps that much:
glibc gives every new thread its own, up to eight per core, and a serving replica's threads (the step loop, the
OpenMP workers, the tokenizer's, the server's) had twelve holding 300 MiB between them at a Qwen2.5-0.5B server's
peak; as many arenas as torch threads keep what the step loop's workers allocate apart, and share the rest.

Garbage collection. Loading a model builds some 230,000 long-lived container objects (the tokenizer's tables,
the modules); each full collection scans them all, 0.25-0.8 s on that VM, and one load triggered four to eight.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -2, -3, -8
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc refuses more on 64-bit (half its heap size)
KEEP_FREED_BYTES = 64 << 20  # free memory a heap keeps at its top; beyond it, a free hands the rest back
_TOP_PAD = 16 << 20  # what each heap growth asks for beyond the request, and what a trim leaves
IDLE_RELEASE_S = 1.0  # a step loop without work this long hands the heap's free pages back to the kernel
# A busy loop hands them back this often: free chunks between live ones (steps of every size, requests coming and
# going) are kept resident by the heap's top-only trim, and grew a Qwen2.5-0.5B server by 100-250 MiB over a
# two-minute run of 32 streams; one re-fault of a step's activations every few seconds costs little.
BUSY_RELEASE_S = 5.0


def keep_freed_memory(arenas: int = 2) -> bool:
    """Tune glibc's allocator for the step loop: a step's activations come from the heap and stay in it between
    steps, up to KEEP_FREED_BYTES free, in at most `arenas` heaps; False where it is not glibc (the process
    runs as before)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    settings = ((_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX), (_M_TRIM_THRESHOLD, KEEP_FREED_BYTES), (_M_TOP_PAD, _TOP_PAD),
                (_M_ARENA_MAX, max(1, arenas)))
    return all(mallopt(option, value) == 1 for option, value in settings)


def release_freed_memory() -> bool:
    """Hand the heap's free pages back to the kernel once (after loading, whose temporaries the settings above
    would otherwise keep resident); False where it is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim(0)
    return True


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection inside (a model load, whose objects all live on), one at the end."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.collect()


def freeze_loaded_objects() -> None:
    """Exempt every object alive now from future collections (a server, once its model is loaded and warm), so
    that a full collection while serving scans only what came since: a stall of every stream otherwise."""
    gc.collect(1)  # the young garbage (a warm-up's); the loaded objects were collected once, after their load
    gc.freeze()


T = TypeVar("T")


def in_passing_thread(build: Callable[[], T]) -> T:
    """Run torch set-up work in a thread that ends with it, so that the caller's thread never starts OpenMP.

    libgomp keeps a pool of worker threads for every thread that has run a parallel region, and once the
    pools together hold more threads than there are cores it stops its workers spinning between regions. A
    step loop in its own thread next to a caller that loaded the model then ran about 1.6 times slower per step
    (docs/benchmarks.md, `benchmarks.backend.decode_step --thread`). A finished thread's pool goes with it.
    """
    box: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            box.append(build())
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="tidegate-engine-setup")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return box[0]
