"""benchmarks/backend/serving_loop.py's parts that need no server: per-thread CPU from /proc, and the report."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from benchmarks.backend.serving_loop import Run, report, thread_cpu


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_thread_cpu_charges_a_busy_thread_to_its_own_id() -> None:
    burned, release = threading.Event(), threading.Event()
    tids: list[int] = []

    def busy() -> None:
        tids.append(threading.get_native_id())
        start = time.thread_time()
        while time.thread_time() - start < 0.2:
            pass
        burned.set()
        release.wait(30)  # stays alive (and in /proc) until read

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        assert burned.wait(30)
        seconds = thread_cpu(os.getpid())
    finally:
        release.set()
        worker.join()
    assert seconds[tids[0]] >= 0.1 and os.getpid() in seconds


def test_the_report_has_a_row_per_run_and_their_medians() -> None:
    runs = [Run(10.0 + i, 50.0 - i, 900.0, 3.0, 0.5, 40.0, 20.0 + i, 2.5) for i in range(3)]
    lines = report(runs).splitlines()
    assert len(lines) == 2 + 3 + 1
    assert lines[-1].startswith("| median | 3.0 | 11.0 | 49.0 ms | 900 ms | 61.5 | 0.50 | 40.0 | 21.0 | 2.5 |")
