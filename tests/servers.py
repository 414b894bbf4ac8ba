"""Real servers for tests: a redis-server on a free loopback port, `tidegate ...` children with their logs in
files, and helpers to wait for a port or for HTTP health."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import redis

from tests.waiting import wait_until
from tidegate.stack.processes import stop_process, wait_for_health

__all__ = ["ChildProcess", "RedisServer", "backend_argv", "free_port", "stop_process", "tidegate_argv",
           "wait_for_health", "wait_for_port"]

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float = 10.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")


@dataclass
class RedisServer:
    """A real redis-server on loopback; `stop()`/`start()` let tests take it away and bring it back."""

    workdir: Path
    port: int = field(default_factory=free_port)
    persistent: bool = False  # append-only file fsynced on every write: a restart keeps everything
    extra_args: list[str] = field(default_factory=list)  # such as a cluster node's flags
    password: str | None = None  # requirepass: clients must send it
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        credentials = f":{self.password}@" if self.password else ""
        return f"redis://{credentials}127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        durability = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
             "--save", "", *durability, "--protected-mode", "yes", "--loglevel", "warning", *self.extra_args,
             *(["--requirepass", self.password] if self.password else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port)
        # the port opens before an append-only file is loaded; until then every command answers LOADING
        wait_until(self._answers_ping, timeout=30, what=f"redis-server on port {self.port} to answer PING")
        return self

    def _answers_ping(self) -> bool:
        client = redis.Redis(port=self.port, socket_timeout=2, password=self.password)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def stop(self) -> None:
        stop_process(self.proc, timeout=5)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def tidegate_argv(*args: str) -> list[str]:
    # this interpreter, so the child runs the same virtual environment as the tests
    return [sys.executable, "-m", "tidegate", *args]


def backend_argv(model_path: Path, port: int, *extra: str) -> list[str]:
    """`tidegate backend` serving the model as `smollm2` on `port`.

    One torch thread: on a machine shared with other test runs, two threads per process oversubscribe the
    cores and run several times slower (a later `--threads` in `extra` wins).
    """
    return tidegate_argv("backend", "--model", str(model_path), "--served-model-name", "smollm2",
                         "--port", str(port), "--threads", "1", *extra)


@dataclass
class ChildProcess:
    """A child with its output in a log file and `port` where it listens; `env` adds to this environment.

    The log is appended to, so a child started again after a kill keeps what it wrote before.
    """

    argv: list[str]
    log_path: Path
    port: int
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, health_timeout: float = 120.0) -> Self:
        return self.launch().wait_healthy(health_timeout)

    def launch(self) -> Self:
        """Start the child and return at once."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
                                         stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait_healthy(self, timeout: float = 120.0) -> Self:
        """Block until /health answers 200; on failure stop the child, so none outlives its test, and show
        the end of its log, which says why."""
        try:
            wait_for_health(f"{self.url}/health", timeout=timeout, proc=self.proc)
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"{exc}\n--- log ---\n{self.log()[-4000:]}") from None
        return self

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.proc, timeout)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def rss_bytes(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")
