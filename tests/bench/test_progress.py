"""The progress line: redrawn in place on a terminal, one line per tick in a log."""

from __future__ import annotations

import asyncio
import io
import time

from bench.progress import Progress
from bench.records import MeasuredRequest


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def finished(ok: bool) -> MeasuredRequest:
    return MeasuredRequest(index=0, scheduled=0.0, chunk_times=[0.1] if ok else [], error=None if ok else "500")


async def test_terminal_progress_redraws_one_line_and_ends_it() -> None:
    out = Terminal()
    progress = Progress("c=4", total=4, stream=out, interval=0.01)
    progress.start(time.perf_counter())
    for ok in (True, True, False):
        progress.update(finished(ok))
    await asyncio.sleep(0.05)
    progress.close()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    assert text.count("\r") >= 2
    assert "c=4 [##################......]  75% 3/4 ok 2 failed 1" in text


async def test_log_progress_writes_whole_lines_for_a_duration_run() -> None:
    out = io.StringIO()
    progress = Progress("rate=2", duration=10.0, stream=out)
    progress.start(time.perf_counter())
    progress.update(finished(True))
    progress.close()
    [line] = out.getvalue().splitlines()
    assert line.startswith("rate=2 [") and " 1 ok 1 failed 0 " in line and "\r" not in out.getvalue()
