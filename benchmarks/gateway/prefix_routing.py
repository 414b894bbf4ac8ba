"""Cache-aware routing: `least_loaded` against `prefix_affinity`, one gateway over 3 backend replicas.

The workload is multi-turn chat: conversations of 8 turns, each turn headed by one ~1,000-token system prompt
that 4 tenants share (each tenant its own account, so its own cache salt), closed loop near saturation. The two
modes run interleaved (A/B/A/B) so that a neighbour's load on a shared machine falls on both; each run gets new
accounts and new prompts, so no run finds another's prefixes in the replicas' caches. A last run sends the same
workload at a third of the load through a single replica: the cached share of prompt tokens routing cannot lose.

    python -m benchmarks.gateway.prefix_routing --rounds 2 --concurrency 12 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from bench.client import Target
from bench.loadgen import LoadGenerator, LoadProfile, RunResult
from bench.tokenizer import PromptTokenizer, load_tokenizer
from bench.workloads import Conversation, Workload, WorkloadSpec
from benchmarks.gateway.vs_litellm import Stack, free_port
from tidegate.stack.processes import wait_for_health

ADMIN_KEY = secrets.token_urlsafe(32)  # a fresh one per run: the gateway refuses short or published keys
MODES = ("least_loaded", "prefix_affinity")
TENANTS = 4
FIRST_WAVE_S = 1.0  # a closed loop schedules every slot's first request at the start of the run


class SharedSystemWorkload(Workload):
    """A tenant's conversations, each turn headed by the system prompt every tenant shares."""

    def __init__(self, spec: WorkloadSpec, tokenizer: PromptTokenizer, seed: int, system: str) -> None:
        super().__init__(spec, tokenizer, seed)
        self._system = system

    def conversations(self) -> Iterator[Conversation]:
        for conversation in super().conversations():
            for turn in conversation:
                turn.system = self._system
            yield conversation


def start_backends(stack: Stack, count: int, threads: int) -> list[str]:
    urls, procs = [], []
    for _ in range(count):
        port = free_port()
        procs.append(stack.spawn([sys.executable, "-m", "tidegate.cli", "backend", "--model", "smollm2",
                                  "--served-model-name", "smollm2", "--port", str(port), "--threads", str(threads),
                                  # near saturation a request waits long for its turn: a 503 would be retried
                                  # elsewhere and measure the retry, not the routing
                                  "--queue-timeout", "600"]))
        urls.append(f"http://127.0.0.1:{port}")
    for url, proc in zip(urls, procs, strict=True):
        wait_for_health(url + "/health", 600, proc)
    return urls


def start_gateway(stack: Stack, backends: list[str], mode: str, run: int,
                  prefix_chars: int, load_epsilon: float) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    config = {"admin_key": ADMIN_KEY, "data_dir": str(stack.workdir / f"gateway-{run}"), "log_level": "warning",
              "routing": {"mode": mode, "prefix_chars": prefix_chars, "load_epsilon": load_epsilon},
              "timeouts": {"connect": 5.0, "first_token": 600.0, "idle": 300.0, "total": 1200.0},
              "channels": [{"name": f"r{i + 1}", "base_url": url + "/v1", "models": ["smollm2"]}
                           for i, url in enumerate(backends)],
              "priority_classes": {"realtime": {"max_concurrency": 256, "queue_size": 1024, "queue_timeout": 600}}}
    path = stack.workdir / f"gateway-{run}.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = stack.spawn([sys.executable, "-m", "tidegate.cli", "gateway", "--config", str(path), "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url + "/health", 120, proc)
    return url, proc


def tenant_keys(url: str) -> list[str]:
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    keys = []
    for tenant in range(TENANTS):
        account = httpx.post(f"{url}/admin/accounts", json={"name": f"tenant-{tenant}"}, headers=admin).json()
        key = httpx.post(f"{url}/admin/keys", json={"account_id": account["id"]}, headers=admin).json()
        keys.append(str(key["key"]))
    return keys


async def drive(url: str, keys: list[str], args: argparse.Namespace, tokenizer: PromptTokenizer, seed: int,
                concurrency: int) -> RunResult:
    """Every tenant at once, each with its share of the concurrency; one result over all their requests."""
    spec = WorkloadSpec(input_len=args.turn_len, output_len=args.output_len, turns=args.turns)
    system = tokenizer.random_text(args.system_len, random.Random(seed))
    per_tenant = max(1, concurrency // len(keys))
    profile = LoadProfile(concurrency=per_tenant, num_requests=args.conversations * args.turns, seed=seed)
    runs = [LoadGenerator(Target(url, "smollm2", key, "/v1/chat/completions", timeout=600.0),
                          SharedSystemWorkload(spec, tokenizer, seed * 100 + i, system), profile).run()
            for i, key in enumerate(keys)]
    results = await asyncio.gather(*runs)
    merged = RunResult(LoadProfile(concurrency=per_tenant * len(keys), num_requests=sum(
        len(r.records) for r in results)), started_at=results[0].started_at)
    merged.records = [record for result in results for record in result.records]
    merged.duration = max(r.duration for r in results)
    return merged


def channel_shares(url: str) -> dict[str, Any]:
    """Prompt tokens by channel and whether they were cache hits, from the gateway's metrics."""
    shares: dict[str, dict[str, float]] = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("tidegate_channel_prompt_tokens_total{"):
            labels, value = line.split("} ")
            fields = dict(part.split("=") for part in labels.split("{")[1].split(","))
            channel, cache = fields["channel"].strip('"'), fields["cache"].strip('"')
            shares.setdefault(channel, {})[cache] = float(value)
        elif line.startswith("tidegate_affinity_overrides_total{"):
            shares.setdefault("overrides", {})[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return shares


def figures(label: str, result: RunResult, url: str) -> dict[str, Any]:
    summary = result.summary()
    keys = ("completed", "failed", "duration", "cached_prompt_share", "total_input_tokens", "total_cached_tokens",
            "output_throughput", "median_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p95_tpot_ms",
            "p95_e2el_ms")
    out = {"run": label, **{k: summary[k] for k in keys}, "channels": channel_shares(url)}
    # The first wave (every slot's first turn, sent at once into caches that hold nothing) is a cold start that
    # routing cannot help; the tail after it is the steady state near saturation.
    later = [r.ttft for r in result.records if r.ok and r.scheduled > FIRST_WAVE_S]
    out["p95_ttft_after_first_wave_ms"] = float(1000 * np.percentile(later, 95)) if later else None
    out["requests"] = [{"scheduled": round(r.scheduled, 3), "turn": r.turn, "ok": r.ok, "input": r.input_tokens,
                        "cached": r.cached_tokens, "ttft": round(r.ttft, 3) if r.ok else None}
                       for r in result.records]
    print(f"{label:>22}: done {out['completed']:4d} failed {out['failed']:3d} cached {out['cached_prompt_share']:.3f} "
          f"TTFT p50 {out['median_ttft_ms']:8.0f} p95 {out['p95_ttft_ms']:8.0f} "
          f"(after the first wave {out['p95_ttft_after_first_wave_ms'] or 0:8.0f}) ms  "
          f"out {out['output_throughput']:6.1f} tok/s  {out['duration']:6.1f} s", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="A/B pairs of runs")
    parser.add_argument("--concurrency", type=int, default=12, help="requests in flight over all tenants")
    parser.add_argument("--conversations", type=int, default=3, help="conversations per tenant per run")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--system-len", type=int, default=1000, help="tokens of the shared system prompt")
    parser.add_argument("--turn-len", type=int, default=96, help="tokens of each user turn")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    # a 1,000-token system prompt of random words is about 6,000 characters: the default 4096 would key every
    # conversation of a tenant by its system prompt alone, and its turns could not follow their history
    parser.add_argument("--prefix-chars", type=int, default=65536, help="routing.prefix_chars of the gateway")
    parser.add_argument("--load-epsilon", type=float, default=0.25, help="routing.load_epsilon of the gateway")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stops the replicas and gateways on the way out
    tokenizer = load_tokenizer()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tidegate-affinity-") as tmp:
        stack = Stack(Path(tmp))
        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
        try:
            backends = start_backends(stack, args.replicas, args.threads)
            # the reference after the first pair, so that a run cut short by time still has one of each
            runs = [(r, mode) for r in range(args.rounds) for mode in MODES]
            runs.insert(len(MODES), (0, "single"))
            for index, (round_, mode) in enumerate(runs):
                single = mode == "single"
                url, proc = start_gateway(stack, backends[:1] if single else backends,
                                          "prefix_affinity" if single else mode, index, args.prefix_chars,
                                          args.load_epsilon)
                concurrency = max(TENANTS, args.concurrency // args.replicas) if single else args.concurrency
                result = asyncio.run(drive(url, tenant_keys(url), args, tokenizer, 1000 + index, concurrency))
                rows.append(figures(f"{mode} #{round_ + 1}", result, url) | {"mode": mode,
                                                                              "concurrency": concurrency})
                stack.stop(proc)
                if args.json:  # after every run, so that a run cut short keeps what it measured
                    args.json.write_text(json.dumps(rows, indent=2))
        finally:
            stack.close()


if __name__ == "__main__":
    main()
