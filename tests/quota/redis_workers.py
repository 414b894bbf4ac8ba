"""Gateway-side worker processes for the cross-process exactness tests (imported by spawned children)."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing.synchronize import Barrier
from pathlib import Path

from config.stores import StoreSettings
from quota import KeyInfo, open_store


def admit_burst(url: str, data_dir: str, keys: list[KeyInfo], estimates: list[int], start: Barrier,
                worker: int) -> list[int]:
    """Runs len(estimates) concurrent admissions from a fresh process; returns the admitted estimates."""

    async def burst() -> list[int]:
        service = await open_store(StoreSettings(redis_url=url, data_dir=Path(data_dir), redis_timeout=3.0))
        await service.authenticate("tg-warm-up")  # connect before the start line, not after
        start.wait()
        answers = await asyncio.gather(*(
            service.admit(keys[n % len(keys)], model="m", estimated_tokens=est, request_id=f"w{worker}-{n}")
            for n, est in enumerate(estimates)))
        await service.close()
        return [est for est, answer in zip(estimates, answers, strict=True) if answer.admitted]

    return asyncio.run(burst())


Burst = Callable[[list[KeyInfo], list[list[int]]], list[int]]


@contextmanager
def process_bursts(url: str, data_dir: Path, workers: int) -> Iterator[Burst]:
    """`burst(keys, estimates)`: each of `workers` fresh processes (gateway replicas, as far as the store can
    tell) runs its list of `estimates` at once from a common start line; returns every admitted estimate."""
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(workers, mp_context=context) as pool:
        start = manager.Barrier(workers)

        def burst(keys: list[KeyInfo], estimates: list[list[int]]) -> list[int]:
            futures = [pool.submit(admit_burst, url, str(data_dir), keys, estimates[w], start, w)
                       for w in range(workers)]
            return [est for f in futures for est in f.result(timeout=120)]

        yield burst
