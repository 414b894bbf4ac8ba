"""A gateway process in front of the instant upstream process, shared by the tests of a module."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.reliability.processes import GatewayProcess, Process
from tests.servers import free_port, wait_for_port


@contextmanager
def instant_upstream(workdir: Path, chunks: int = 20) -> Iterator[str]:
    """`benchmarks.gateway.instant_upstream` as a process: answers at once, so the gateway is all that is measured."""
    port = free_port()
    upstream = Process([sys.executable, "-m", "benchmarks.gateway.instant_upstream", "--port", str(port), "--chunks",
                        str(chunks)], workdir / "upstream.log", port)
    with upstream.log_path.open("ab") as log:
        upstream.proc = subprocess.Popen(upstream.argv, stdout=log, stderr=subprocess.STDOUT)
    wait_for_port(port)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        upstream.stop()


@contextmanager
def gateway_over_instant_upstream(workdir: Path, chunks: int = 20, **settings: Any) -> Iterator[GatewayProcess]:
    with instant_upstream(workdir, chunks) as url:
        gateway = GatewayProcess.create(workdir, [url], **settings).start()
        try:
            yield gateway
        finally:
            gateway.stop()
