"""`tidegate up` end to end: the printed credentials work, a crashed replica comes back, Ctrl-C stops all,
and a second start reuses the same store and keys."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.servers import free_port
from tests.tidegate.stack.up_process import UpProcess
from tests.waiting import wait_until
from tidegate.stack.up import EXAMPLE_QUESTION, _port


@pytest.fixture
def up_ports() -> Iterator[tuple[int, int]]:
    yield free_port(), free_port()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0


def test_up_serves_restarts_a_crashed_replica_and_stops_cleanly(tmp_path: Path, model_path: Path,
                                                                up_ports: tuple[int, int]) -> None:
    port, backend_port = up_ports
    up = UpProcess(tmp_path / "data", port, backend_port)
    try:
        api_key = up.wait_for(r"API key:\s+(tg-\S+)").group(1)
        admin_key = up.wait_for(r"admin key:\s+(\S+)").group(1)
        assert up.wait_for(r"curl http://127\.0\.0\.1:\d+/v1/chat/completions")
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=api_key, max_retries=0, timeout=120)
        # the printed example, without sampling fields: the model's generation defaults answer it correctly
        reply = client.chat.completions.create(model="smollm2", max_tokens=16,
                                               messages=[{"role": "user", "content": EXAMPLE_QUESTION}])
        assert "Paris" in (reply.choices[0].message.content or "")
        assert reply.usage and reply.usage.completion_tokens > 0
        assert httpx.get(f"http://127.0.0.1:{port}/admin/accounts",
                         headers={"authorization": f"Bearer {admin_key}"}).status_code == 200

        backend_pid = int(up.wait_for(r"started backend-1 \(pid (\d+)\)").group(1))
        os.kill(backend_pid, signal.SIGKILL)
        up.wait_for(r"backend-1 exited \(-9\); restarting in 1s")
        new_pid = int(up.wait_for(rf"started backend-1 \(pid (?!{backend_pid}\))(\d+)\)").group(1))
        assert new_pid != backend_pid

        def served_again() -> bool:  # the gateway routes to the replica again once it is healthy
            try:
                client.chat.completions.create(model="smollm2", max_tokens=4,
                                               messages=[{"role": "user", "content": "Again"}])
            except Exception:
                return False
            return True

        wait_until(served_again, timeout=180, what="the restarted replica serving", interval=0.2)
        gateway_pid = int(up.wait_for(r"started gateway \(pid (\d+)\)").group(1))
    finally:
        code = up.interrupt()
    assert code == 0
    assert not _alive(new_pid) and not _alive(gateway_pid)

    # a second start keeps the store: the same keys, only named by their files now, and the first run's usage
    again = UpProcess(tmp_path / "data", port, backend_port)
    try:
        api_key_file = Path(again.wait_for(r"API key:\s+in (\S+)").group(1))
        admin_key_file = Path(again.wait_for(r"admin key:\s+in (\S+)").group(1))
        assert api_key_file.read_text().strip() == api_key and admin_key_file.read_text().strip() == admin_key
        assert not any(api_key in line or admin_key in line for line in again.lines)
        usage = httpx.get(f"http://127.0.0.1:{port}/admin/usage", headers={"authorization": f"Bearer {admin_key}"})
        assert usage.status_code == 200 and usage.json()["requests"] >= 2
    finally:
        assert again.interrupt() == 0


def test_up_refuses_a_gateway_port_already_taken_before_starting_anything(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        up = UpProcess(tmp_path / "data", taken, free_port())
        assert up.proc.wait(timeout=120) == 1
    output = "\n".join(up.lines)
    assert f"cannot listen on 127.0.0.1:{taken}" in output
    assert "starting" not in output  # no replica was started to be answered in the gateway's place


def test_a_replica_never_takes_the_gateway_port_even_when_asked_for_it() -> None:
    gateway = free_port()
    assert _port(gateway, reserved=gateway) != gateway
    other = free_port()
    assert _port(other, reserved=gateway) == other  # a free port that is not the gateway's is kept
