"""`tidegate up --replicas 1:2` end to end: a load that fills the queue brings a second replica, which serves;
when the load falls it is drained and stopped, and no request fails on the way up or down."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
from openai import OpenAI

from tests.servers import free_port
from tests.tidegate.stack.up_process import UpProcess
from tests.waiting import wait_until

# short windows, and a target that a few clients exceed at once: each replica runs one request at a time
ELASTIC_FLAGS = ("--replicas", "1:2", "--metrics-interval", "0.5", "--scale-up-window", "2",
                 "--scale-down-window", "4", "--cooldown", "1", "--target-waiting", "1", "--target-ttft-p95", "60")
# and deadlines long enough for the queue to wait out a replica's model load on a busy machine
ONE_AT_A_TIME = {"TIDEGATE_BACKEND__MAX_NUM_SEQS": "1", "TIDEGATE_BACKEND__QUEUE_TIMEOUT": "240",
                 "TIDEGATE_GATEWAY__TIMEOUTS__FIRST_TOKEN": "240", "TIDEGATE_GATEWAY__TIMEOUTS__TOTAL": "300"}


class Load:
    """`clients` threads, each sending one short request after another until stopped; counts what failed."""

    def __init__(self, client: OpenAI, clients: int):
        self._client = client
        self._stop = threading.Event()
        self.completed = 0
        self.failures: list[str] = []
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._client.chat.completions.create(model="smollm2", max_tokens=8,
                                                     messages=[{"role": "user", "content": "Count to five."}])
                self.completed += 1
            except Exception as exc:
                self.failures.append(repr(exc))

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)


def _served_by(base: str, admin_key: str, channel: str) -> int:
    row = httpx.get(f"{base}/admin/channels/{channel}", headers={"authorization": f"Bearer {admin_key}"}).json()
    return int(row.get("models", {}).get("smollm2", {}).get("attempts", 0))


def test_a_filled_queue_adds_a_replica_and_low_load_drains_it_without_a_failure(tmp_path: Path,
                                                                                  model_path: Path) -> None:
    port = free_port()
    up = UpProcess(tmp_path / "data", port, free_port(), *ELASTIC_FLAGS, env=ONE_AT_A_TIME)
    try:
        api_key = up.wait_for(r"API key:\s+(tg-\S+)").group(1)
        admin_key = up.wait_for(r"admin key:\s+(\S+)").group(1)
        base = f"http://127.0.0.1:{port}"
        client = OpenAI(base_url=f"{base}/v1", api_key=api_key, max_retries=0, timeout=120)

        peak = Load(client, clients=4)
        decision = up.wait_for_event("autoscale.decision", action="up", to=2)
        assert "waiting" in str(decision["reason"])
        up.wait_for_event("autoscale.serving", replica="backend-2")
        wait_until(lambda: _served_by(base, admin_key, "backend-2") > 0, timeout=60,
                   what="a request served by the new replica")
        peak.stop()

        # one client keeps going, so the drained replica may hold a request in flight as it goes
        trickle = Load(client, clients=1)
        up.wait_for_event("autoscale.decision", action="down", to=1)
        up.wait_for_event("autoscale.stopped", replica="backend-2")
        trickle.stop()
        channels = httpx.get(f"{base}/admin/channels", headers={"authorization": f"Bearer {admin_key}"}).json()
        assert [c["name"] for c in channels["data"]] == ["backend-1"]
    finally:
        assert up.interrupt() == 0
    assert peak.failures == [] and trickle.failures == []
    assert peak.completed > 0 and trickle.completed > 0
