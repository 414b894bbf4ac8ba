"""Child processes of the CLI, the benchmarks and the tests: wait until one is healthy, stop one cleanly."""

from __future__ import annotations

import subprocess
import time

import httpx


def wait_for_health(url: str, timeout: float = 60.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll `url` until it answers 200; fail early if `proc` has died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before {url} was healthy")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not healthy after {timeout}s")


def stop_process(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited after `timeout` seconds; a no-op for one already gone."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
