"""`tidegate up` as a child of a test, its output read line by line as it comes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[3]
T = TypeVar("T")


class UpProcess:
    """`tidegate up` with its stdout collected line by line."""

    def __init__(self, data_dir: Path, port: int, backend_port: int, *flags: str, env: dict[str, str] | None = None):
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tidegate", "up", "--port", str(port), "--backend-port", str(backend_port),
             "--data-dir", str(data_dir), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 240.0) -> re.Match[str]:
        return self._first_line(lambda line: re.search(pattern, line), f"a line matching {pattern!r}", timeout)

    def wait_for_event(self, event: str, timeout: float = 240.0, **fields: object) -> dict[str, object]:
        """The first JSON log line of `event` whose fields hold the given values."""
        def matching(line: str) -> dict[str, object] | None:
            record = json.loads(line) if line.startswith("{") else {}
            wanted = record.get("event") == event and all(record.get(k) == v for k, v in fields.items())
            return record if wanted else None
        return self._first_line(matching, f"a {event} event with {fields}", timeout)

    def _first_line(self, match: Callable[[str], T | None], what: str, timeout: float) -> T:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for line in self.lines[seen:]:
                found = match(line)
                if found:
                    return found
            seen = len(self.lines)
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no {what}; output:\n" + "\n".join(self.lines[-40:]))

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=60)
