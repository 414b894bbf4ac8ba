"""Child processes of the CLI, the benchmarks and the tests: start one with its log, wait until one is healthy,
stop one cleanly."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def local_get(url: str, timeout: float = 1.0) -> httpx.Response:
    """GET from a process of this stack. `httpx.get` loads the CA bundle and reads the proxy settings on every
    call (~24 ms of CPU); polled at 10 Hz, that made a starting backend see a busy machine and choose passive
    CPU workers (1.4x slower decode steps). A plain-HTTP URL needs neither."""
    plain = url.startswith("http://")
    return httpx.get(url, timeout=timeout, verify=not plain, trust_env=not plain)


def wait_for_health(url: str, timeout: float = 60.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll `url` until it answers 200; fail early if `proc` has died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before {url} was healthy")
        try:
            if local_get(url).status_code == 200:
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


@dataclass(slots=True)
class Child:
    """A long-running child of `tidegate up`, which restarts it with backoff when it dies."""

    name: str
    argv: list[str]
    health_url: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    backoff: float = 1.0
    restart_at: float | None = None
    restarts: int = field(default=0)

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.started_at = time.monotonic()
        self.restart_at = None
        print(f"started {self.name} (pid {self.proc.pid}); log {self.log_path}", flush=True)

    @property
    def url(self) -> str:
        return self.health_url.removesuffix("/health")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.proc, timeout)
