"""Realtime P95 TTFT at a steady load, with and without a batch draining through the same backend.

One backend replica behind one gateway (embedded store). Each run measures realtime traffic with `tidegate bench`
(open loop, Poisson arrivals at `--rate`): alone, or while a `--batch-lines` batch of another account drains
through the `batch` class. Runs alternate (alone, with batch, alone, ...) so that a neighbour's load on a shared
machine falls on both; each run gets a fresh gateway, and the batch of a run is cancelled at its end. The
dispatcher's TTFT threshold is `--yield-ttft` seconds, by default the first alone run's P95 (the realtime SLO
is "as if no batch ran").

    python -m benchmarks.gateway.batch_drain --rounds 1 --rate 1 --duration 45 --json out.json
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.gateway.vs_litellm import Stack, free_port
from tidegate.stack.processes import wait_for_health

ADMIN_KEY = secrets.token_urlsafe(32)  # a fresh one per run: the gateway refuses short or published keys
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


def start_backend(stack: Stack, threads: int) -> str:
    port = free_port()
    proc = stack.spawn([sys.executable, "-m", "tidegate.cli", "backend", "--model", "smollm2", "--served-model-name",
                        "smollm2", "--port", str(port), "--threads", str(threads), "--queue-timeout", "600"])
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url + "/health", 600, proc)
    return url


def start_gateway(stack: Stack, backend: str, run: int, args: argparse.Namespace,
                  yield_ttft: float) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    config = {"admin_key": ADMIN_KEY, "data_dir": str(stack.workdir / f"gateway-{run}"), "log_level": "warning",
              "timeouts": {"connect": 5.0, "first_token": 300.0, "idle": 120.0, "total": 600.0},
              "channels": [{"name": "backend", "base_url": backend + "/v1", "models": ["smollm2"]}],
              "batch": {"max_in_flight": args.max_in_flight, "yield_ttft_seconds": yield_ttft,
                        "yield_active": args.yield_active}}
    path = stack.workdir / f"gateway-{run}.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = stack.spawn([sys.executable, "-m", "tidegate.cli", "gateway", "--config", str(path), "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url + "/health", 120, proc)
    while httpx.get(url + "/health").json()["healthy_channels"] < 1:
        time.sleep(0.2)
    return url, proc


def new_key(url: str, name: str) -> str:
    account = httpx.post(f"{url}/admin/accounts", json={"name": name}, headers=ADMIN).json()
    return str(httpx.post(f"{url}/admin/keys", json={"account_id": account["id"]}, headers=ADMIN).json()["key"])


def start_batch(url: str, key: str, lines: int, output_len: int) -> str:
    auth = {"authorization": f"Bearer {key}"}
    content = "".join(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "smollm2", "max_tokens": output_len, "messages": [{"role": "user", "content": f"Tell story {i}."}]}})
        + "\n" for i in range(lines))
    upload = httpx.post(f"{url}/v1/files", headers=auth, data={"purpose": "batch"},
                        files={"file": ("batch.jsonl", content.encode())}, timeout=60).json()
    batch = httpx.post(f"{url}/v1/batches", headers=auth, timeout=60, json={
        "input_file_id": upload["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}).json()
    return str(batch["id"])


def batch_counts(url: str, key: str, batch_id: str) -> dict[str, Any]:
    batch = httpx.get(f"{url}/v1/batches/{batch_id}", headers={"authorization": f"Bearer {key}"}).json()
    return dict(batch["request_counts"])


def bench(url: str, key: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    subprocess.run([sys.executable, "-m", "tidegate.cli", "bench", "--base-url", url, "--model", "smollm2",
                    "--api-key", key, "--endpoint", "/v1/chat/completions", "--rate", str(args.rate),
                    "--duration", str(args.duration), "--input-len", str(args.input_len),
                    "--output-len", str(args.output_len), "--seed", "7", "--warmup", str(args.warmup), "--no-progress",
                    "--json", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    return dict(json.loads(out.read_text()))


def one_run(stack: Stack, backend: str, run: int, with_batch: bool, args: argparse.Namespace,
            yield_ttft: float) -> dict[str, Any]:
    url, proc = start_gateway(stack, backend, run, args, yield_ttft)
    try:
        realtime, tenant = new_key(url, "realtime"), new_key(url, "batch-tenant")
        batch_id = start_batch(url, tenant, args.batch_lines, args.batch_output_len) if with_batch else None
        started = time.monotonic()
        result = bench(url, realtime, args, stack.workdir / f"bench-{run}.json")
        row = {"run": run, "with_batch": with_batch, "yield_ttft_seconds": yield_ttft,
               **{k: result[k] for k in ("completed", "failed", "duration", "request_throughput",
                                         "output_throughput", "median_ttft_ms", "p95_ttft_ms", "p99_ttft_ms",
                                         "p95_tpot_ms", "p95_e2el_ms")}}
        if batch_id is not None:
            counts = batch_counts(url, tenant, batch_id)
            row["batch_lines_done"] = counts["completed"] + counts["failed"]
            row["batch_lines_per_s"] = round(row["batch_lines_done"] / (time.monotonic() - started), 2)
            row["batch_tokens_per_s"] = round(row["batch_lines_per_s"] * args.batch_output_len, 1)
            httpx.post(f"{url}/v1/batches/{batch_id}/cancel", headers={"authorization": f"Bearer {tenant}"})
        print(json.dumps(row), flush=True)
        return row
    finally:
        stack.stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="alone / with-batch pairs")
    parser.add_argument("--rate", type=float, default=1.0, help="realtime requests per second (Poisson)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of realtime sending per run")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=5, help="realtime requests sent before measuring")
    parser.add_argument("--batch-lines", type=int, default=1000)
    parser.add_argument("--batch-output-len", type=int, default=32)
    parser.add_argument("--max-in-flight", type=int, default=8, help="batch.max_in_flight of the gateway")
    parser.add_argument("--yield-ttft", type=float, help="batch.yield_ttft_seconds (default: the alone P95)")
    parser.add_argument("--yield-active", type=int, help="batch.yield_active: realtime in flight that halves lines")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the backend")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tidegate-batch-drain-") as tmp:
        stack = Stack(Path(tmp))
        try:
            backend = start_backend(stack, args.threads)
            yield_ttft = args.yield_ttft or 1.0
            for run in range(2 * args.rounds):
                with_batch = run % 2 == 1
                rows.append(one_run(stack, backend, run, with_batch, args, yield_ttft))
                if run == 0 and args.yield_ttft is None:
                    yield_ttft = rows[0]["p95_ttft_ms"] / 1000
                if args.json:  # after every run, so that a run cut short keeps what it measured
                    args.json.write_text(json.dumps(rows, indent=2))
        finally:
            stack.close()
    alone = [r["p95_ttft_ms"] for r in rows if not r["with_batch"]]
    beside = [r["p95_ttft_ms"] for r in rows if r["with_batch"]]
    if alone and beside:
        print(f"realtime P95 TTFT alone {sum(alone) / len(alone):.0f} ms, beside the batch "
              f"{sum(beside) / len(beside):.0f} ms ({sum(beside) / sum(alone) * len(alone) / len(beside) - 1:+.1%})")


if __name__ == "__main__":
    main()
