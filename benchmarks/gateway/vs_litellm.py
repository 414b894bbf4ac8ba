"""Gateway overhead: tidegate against a LiteLLM proxy, side by side, in front of the same instant upstream.

Each target gets the same wrk runs: requests/s at concurrency 32 (whole answers and 20-chunk streams), and
the median latency at concurrency 1, from which the instant upstream's own median (measured directly in the
same run) is subtracted to give the latency each proxy adds. tidegate runs with auth, Redis admission,
routing and a usage write on every request; LiteLLM with a master key and no database.

    python -m benchmarks.gateway.vs_litellm --duration 10 --litellm LITELLM --workers 1,2 --json out.json

where LITELLM is the `litellm` executable of a separate virtual environment (`python -m venv VENV &&
VENV/bin/pip install 'litellm[proxy]==1.108.7'` gives VENV/bin/litellm); without --litellm only tidegate runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import yaml

from tidegate.stack.processes import stop_process, wait_for_health

# a fresh random key per run: the gateway refuses short or published ones
ADMIN_KEY = secrets.token_urlsafe(32)
LITELLM_KEY = "sk-bench-master"
BODY = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hello in five words."}], "max_tokens": 20}


@dataclass(slots=True)
class Figure:
    target: str
    mode: str  # whole or stream
    concurrency: int
    requests_per_s: float
    median_ms: float
    non_2xx: int
    errors: int
    cpu_ms_per_request: float = 0.0  # CPU time of the target's process tree per request: load-independent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Stack:
    """The processes of one benchmark run; all are stopped on exit."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, argv: list[str], env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"proc-{len(self.procs)}.log", "wb")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                cwd=cwd)
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        stop_process(proc, timeout=15)

    def close(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc)


def start_upstream_and_redis(stack: Stack) -> tuple[str, str, subprocess.Popen[bytes]]:
    """The instant upstream, once healthy, and an empty Redis: the upstream's URL, Redis's URL without a database,
    and the upstream's process."""
    upstream_port, redis_port = free_port(), free_port()
    instant = stack.spawn([sys.executable, "-m", "benchmarks.gateway.instant_upstream", "--port", str(upstream_port)])
    stack.spawn(["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no"])
    upstream = f"http://127.0.0.1:{upstream_port}"
    wait_for_health(upstream + "/health", 120, instant)
    return upstream, f"redis://127.0.0.1:{redis_port}", instant


def start_tidegate(stack: Stack, upstream_url: str, redis_url: str, workers: int,
                   tree: Path | None = None) -> tuple[str, str, subprocess.Popen[bytes]]:
    """A gateway on a fresh port with one account and key; `tree` is the checkout it runs from (its packages
    shadow the installed ones), the current directory when not given."""
    port = free_port()
    config = {"admin_key": ADMIN_KEY, "redis_url": redis_url, "workers": workers, "log_level": "warning",
              "channels": [{"name": "instant", "base_url": upstream_url, "models": ["smollm2"],
                            "max_concurrency": 1024}],
              "priority_classes": {"realtime": {"max_concurrency": 512, "queue_size": 1024, "queue_timeout": 30}}}
    path = stack.workdir / f"tidegate-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = stack.spawn([sys.executable, "-m", "tidegate.cli", "gateway", "--config", str(path), "--port", str(port)],
                       cwd=tree)
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url + "/health", 120, proc)
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    account = httpx.post(f"{url}/admin/accounts", json={"name": "bench"}, headers=admin).json()
    key = httpx.post(f"{url}/admin/keys", json={"account_id": account["id"]}, headers=admin).json()
    return url, str(key["key"]), proc


def start_litellm(stack: Stack, litellm: str, upstream_url: str) -> tuple[str, str, subprocess.Popen[bytes]]:
    port = free_port()
    config = {"model_list": [{"model_name": "smollm2", "litellm_params": {
        "model": "openai/smollm2", "api_base": upstream_url, "api_key": "unused"}}],
        "general_settings": {"master_key": LITELLM_KEY}, "litellm_settings": {"telemetry": False}}
    path = stack.workdir / "litellm.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = stack.spawn([litellm, "--config", str(path), "--port", str(port), "--num_workers", "1"],
                       env={"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False"})
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url + "/health/liveliness", 300, proc)
    return url, LITELLM_KEY, proc


def wrk(url: str, key: str | None, stream: bool, concurrency: int, duration: int, workdir: Path) -> Figure:
    body = {**BODY, "stream": stream}
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    script = workdir / "post.lua"
    script.write_text("wrk.method = 'POST'\n" + f"wrk.body = {json.dumps(json.dumps(body))}\n" + "".join(
        f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}\n" for k, v in headers.items()))
    threads = min(2, concurrency)
    done = subprocess.run(["wrk", f"-t{threads}", f"-c{concurrency}", f"-d{duration}s", "--timeout", "60s", "--latency", "-s", str(script),
                           url + "/v1/chat/completions"], capture_output=True, text=True, check=True)
    out = done.stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    median = _ms(re.search(r"50%\s+([\d.]+\w+)", out).group(1))  # type: ignore[union-attr]
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return Figure("", "stream" if stream else "whole", concurrency, rate, median,
                  int(non_2xx.group(1)) if non_2xx else 0, sum(map(int, errors.groups())) if errors else 0)


def _ms(value: str) -> float:
    number, unit = re.match(r"([\d.]+)(\w+)", value).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def cpu_seconds(root: int) -> float:
    """User + system CPU seconds of a process and all its descendants (uvicorn workers), from /proc."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier += children
    return sum(times.get(pid, 0.0) for pid in tree)


def measure(name: str, url: str, key: str | None, duration: int, workdir: Path, pid: int) -> list[Figure]:
    figures = []
    for stream in (False, True):
        wrk(url, key, stream, 8, 2, workdir)  # warm-up: connections, caches, lazy imports
        for concurrency in (32, 1):
            before = cpu_seconds(pid)
            figure = wrk(url, key, stream, concurrency, duration, workdir)
            used = cpu_seconds(pid) - before
            figure.cpu_ms_per_request = round(1000 * used / max(1.0, figure.requests_per_s * duration), 3)
            figure.target = name
            figures.append(figure)
            print(f"{name:>14} {figure.mode:>6} c={concurrency:<3} {figure.requests_per_s:9.1f} req/s "
                  f"median {figure.median_ms:8.2f} ms cpu/req {figure.cpu_ms_per_request:7.3f} ms "
                  f"non-2xx {figure.non_2xx} errors {figure.errors}", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--litellm", help="the litellm executable of a separate venv; omitted: tidegate only")
    parser.add_argument("--workers", default="1", help="comma-separated tidegate worker counts to measure")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    if shutil.which("wrk") is None or shutil.which("redis-server") is None:
        sys.exit("benchmarks.gateway.vs_litellm needs wrk and redis-server on PATH")
    with tempfile.TemporaryDirectory(prefix="tidegate-bench-") as tmp:
        workdir = Path(tmp)
        stack = Stack(workdir)
        try:
            upstream, redis, instant = start_upstream_and_redis(stack)
            figures = measure("upstream", upstream, None, args.duration, workdir, instant.pid)
            for workers in (int(w) for w in args.workers.split(",")):
                url, key, proc = start_tidegate(stack, upstream + "/v1", f"{redis}/0", workers)
                figures += measure(f"tidegate-w{workers}", url, key, args.duration, workdir, proc.pid)
                stack.stop(proc)
            if args.litellm:
                url, key, proc = start_litellm(stack, args.litellm, upstream + "/v1")
                figures += measure("litellm", url, key, args.duration, workdir, proc.pid)
        finally:
            stack.close()
    if args.json:
        args.json.write_text(json.dumps([asdict(f) for f in figures], indent=2))


if __name__ == "__main__":
    main()
