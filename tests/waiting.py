"""Waiting on state a test can observe (health, /metrics, queue depth, logs, counters) instead of sleeping.

A bare sleep guesses how long the machine needs; on a busy 2-core machine the guess is sometimes wrong and the
test flakes. These poll until the state holds, with deadlines generous enough for a loaded machine, and fail
with a message that names what was awaited and what was last seen.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast, overload

__all__ = ["wait_until", "wait_until_async"]

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 30.0, what: str = "the condition",
               interval: float = 0.05) -> T:
    """Poll `predicate` until it returns something truthy and return that; AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g}s for {what}; last seen: {value!r}")
        time.sleep(interval)


@overload
async def wait_until_async(predicate: Callable[[], Awaitable[T]], timeout: float = ..., what: str = ...,
                           interval: float = ...) -> T: ...
@overload
async def wait_until_async(predicate: Callable[[], T], timeout: float = ..., what: str = ...,
                           interval: float = ...) -> T: ...
async def wait_until_async(predicate: Callable[[], Awaitable[T] | T], timeout: float = 30.0,
                           what: str = "the condition", interval: float = 0.02) -> T:
    """`wait_until` for a test's event loop: `predicate` may be a coroutine function, and the loop keeps
    serving the in-process servers while it waits."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        value = cast(T, await result if inspect.isawaitable(result) else result)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g}s for {what}; last seen: {value!r}")
        await asyncio.sleep(interval)
