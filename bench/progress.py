"""A live progress line on stderr: plain text, redrawn in place on a terminal, periodic lines otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import TextIO

from bench.records import MeasuredRequest

_BAR = 24


class Progress:
    """Counts finished requests against a request count or a duration and draws them every `interval`."""

    def __init__(self, label: str, total: int | None = None, duration: float | None = None,
                 stream: TextIO | None = None, interval: float = 0.5) -> None:
        self.label = label
        self.total = total
        self.duration = duration
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        # off a terminal a line every few seconds keeps logs readable
        self.interval = interval if self.tty else max(interval, 5.0)
        self.ok = 0
        self.failed = 0
        self._t0 = 0.0
        self._task: asyncio.Task[None] | None = None

    def update(self, record: MeasuredRequest) -> None:
        if record.ok:
            self.ok += 1
        else:
            self.failed += 1

    def start(self, t0: float) -> None:
        self._t0 = t0
        self._task = asyncio.get_running_loop().create_task(self._tick())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._draw(final=True)

    async def _tick(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await asyncio.sleep(self.interval)
                self._draw()

    def line(self) -> str:
        elapsed = time.perf_counter() - self._t0
        done = self.ok + self.failed
        if self.total:
            share = done / self.total
            count = f"{done}/{self.total}"
        else:
            share = elapsed / self.duration if self.duration else 0.0
            count = f"{done}"
        share = min(share, 1.0)
        filled = round(share * _BAR)
        rate = done / elapsed if elapsed > 0 else 0.0
        return (f"{self.label} [{'#' * filled}{'.' * (_BAR - filled)}] {share:4.0%} {count} "
                f"ok {self.ok} failed {self.failed} {rate:.2f} req/s {elapsed:.0f}s")

    def _draw(self, final: bool = False) -> None:
        if self.tty:
            # padded so a shorter line fully covers the one it redraws
            self.stream.write("\r" + self.line().ljust(100) + ("\n" if final else ""))
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()
