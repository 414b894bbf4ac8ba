"""How fast `tidegate up --replicas 1:2` follows a load step: from the step to the autoscaler's decision, to the
new replica healthy (model load and warm-up included) and registered, to its first request served.

    .venv/bin/python -m benchmarks.gateway.scale_up --clients 4 --rounds 2

Each round starts from one replica, steps from no load to `--clients` closed-loop clients, waits until the new
replica has served a request, then stops the load and waits until the replica is drained and stopped. Each
backend runs `--max-num-seqs` requests at a time, so a few clients are enough to fill its queue. The times are
read off the stack's own JSON log lines, stamped as they arrive, and off `GET /admin/channels/backend-2`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
from openai import OpenAI

TIMES = ("decision_s", "replica_ready_s", "serving_s", "first_served_s")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Stack:
    """`tidegate up` with every output line kept beside the monotonic time it arrived."""

    def __init__(self, flags: list[str], env: dict[str, str]):
        self.port = _free_port()
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tidegate", "up", "--port", str(self.port), "--backend-port", str(_free_port()),
             "--data-dir", tempfile.mkdtemp(prefix="scale-up-"), "--show-keys", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def first(self, pattern: str, after: float = 0.0, timeout: float = 600.0) -> tuple[float, re.Match[str]]:
        """The first line after `after` matching `pattern`, and when it arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            for at, line in list(self.lines):
                found = re.search(pattern, line)
                if at >= after and found:
                    return at, found
            time.sleep(0.05)
        raise RuntimeError(f"no line matching {pattern!r}; last lines:\n" +
                           "\n".join(line for _, line in self.lines[-20:]))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=120)


class ClosedLoop:
    def __init__(self, client: OpenAI, clients: int, max_tokens: int):
        self.errors: Counter[str] = Counter()  # by HTTP status, or the exception's class without one
        self.completed = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(client, max_tokens)) for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def _run(self, client: OpenAI, max_tokens: int) -> None:
        while not self._stop.is_set():
            try:
                client.completions.create(model="smollm2", prompt="Write about the sea.", max_tokens=max_tokens,
                                          extra_body={"ignore_eos": True})
                self.completed += 1
            except Exception as exc:
                self.errors[str(getattr(exc, "status_code", type(exc).__name__))] += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def _attempts(stack: Stack, admin_key: str) -> int:
    reply = httpx.get(f"http://127.0.0.1:{stack.port}/admin/channels/backend-2",
                      headers={"authorization": f"Bearer {admin_key}"}, timeout=10)
    if reply.status_code != 200:
        return 0
    return int(reply.json()["models"].get("smollm2", {}).get("attempts", 0))


def one_round(stack: Stack, client: OpenAI, admin_key: str, args: argparse.Namespace) -> dict[str, object]:
    step = time.monotonic()
    load = ClosedLoop(client, args.clients, args.max_tokens)
    try:
        decided, _ = stack.first(r'"autoscale\.decision", "action": "up"', after=step)
        started, _ = stack.first(r"started backend-2 ", after=step)
        serving, _ = stack.first(r'"autoscale\.serving", "replica": "backend-2"', after=step)
        while _attempts(stack, admin_key) == 0:
            time.sleep(0.1)
        served = time.monotonic()
    finally:
        load.stop()
    stack.first(r'"autoscale\.stopped", "replica": "backend-2"', after=step)
    return {"decision_s": decided - step, "replica_ready_s": serving - started, "serving_s": serving - step,
            "first_served_s": served - step, "requests": load.completed, "errors": dict(load.errors)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=1, help="each backend's batch size")
    parser.add_argument("--scale-up-window", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    flags = ["--replicas", "1:2", "--metrics-interval", "0.5", "--scale-up-window", str(args.scale_up_window),
             "--scale-down-window", "3", "--cooldown", "1", "--target-waiting", "1"]
    stack = Stack(flags, {"TIDEGATE_BACKEND__MAX_NUM_SEQS": str(args.max_num_seqs)})
    try:
        admin_key = stack.first(r"admin key:\s+(\S+)")[1].group(1)
        api_key = stack.first(r"API key:\s+(tg-\S+)")[1].group(1)
        client = OpenAI(base_url=f"http://127.0.0.1:{stack.port}/v1", api_key=api_key, max_retries=0, timeout=300)
        rounds = []
        for i in range(args.rounds):
            rounds.append(one_round(stack, client, admin_key, args))
            print(f"round {i + 1}: {json.dumps(rounds[-1])}", flush=True)
    finally:
        stack.stop()
    summary = {k: round(statistics.median(float(str(r[k])) for r in rounds), 1) for k in TIMES}
    print(f"median: {json.dumps(summary)}")
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "median": summary, "args": vars(args)}, default=str))


if __name__ == "__main__":
    main()
