"""Gateway-side worker processes for the cross-process exactness tests (imported by spawned children)."""

from __future__ import annotations

import asyncio
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
