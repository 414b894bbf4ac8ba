"""Admissions per second from one gateway process: on the embedded store, and on Redis with one round trip each.

Each admission checks and reserves RPM, TPM and a concurrency lease on the key and RPM and TPM on its account,
as a gateway request does; the "buckets on" runs add a request bucket and a token bucket on both levels.
`--concurrency` tasks admit in a closed loop. Besides wall-clock throughput it
reports the client's CPU time per admission and, for Redis, the server's CPU time and the number of Redis
commands per admission (from INFO), next to a baseline measured in the same run: an empty async call
in-process, and a one-line Lua script through the same batched connection against Redis.

    .venv/bin/python -m benchmarks.gateway.admission --admissions 20000 --concurrency 256
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import redis

from config.stores import StoreSettings
from quota import KeyInfo, QuotaService, open_store
from quota.stores.redis.script_batch import ScriptBatcher

BIG = 10**12  # limits that are checked and charged on every admission but never reached
BUCKETS = {"request_bucket": {"rate": 10**9, "burst": BIG}, "token_bucket": {"rate": 10**9, "burst": BIG}}


@dataclass(slots=True)
class Figures:
    name: str
    admissions: int
    per_second: float
    client_cpu_us: float
    p50_ms: float
    p99_ms: float
    server_cpu_us: float | None = None
    redis_commands: float | None = None


async def closed_loop(call: Callable[[int], Awaitable[object]], total: int, concurrency: int,
                      name: str) -> Figures:
    latencies: list[float] = []

    async def worker(first: int) -> None:
        for n in range(first, total, concurrency):
            start = time.perf_counter()
            await call(n)
            latencies.append(time.perf_counter() - start)

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    latencies.sort()
    return Figures(name, total, total / wall, cpu / total * 1e6, latencies[len(latencies) // 2] * 1e3,
                   latencies[int(len(latencies) * 0.99)] * 1e3)


async def tenant(service: QuotaService, buckets: bool) -> KeyInfo:
    extra = BUCKETS if buckets else {}
    account = await service.admin.create_account("bench", {"rpm": BIG, "tpm": BIG, **extra})
    created = await service.admin.create_key(account_id=account.id,
                                             quota={"rpm": BIG, "tpm": BIG, "max_concurrency": BIG, **extra})
    auth = await service.authenticate(created.secret)
    assert auth.key is not None
    return auth.key


async def admissions(settings: StoreSettings, total: int, concurrency: int, name: str,
                     buckets: bool = False) -> Figures:
    service = await open_store(settings)
    key = await tenant(service, buckets)

    async def admit(n: int) -> None:
        answer = await service.admit(key, model="m", estimated_tokens=100, request_id=f"r{n}")
        assert answer.admitted and not answer.degraded, answer

    await closed_loop(admit, min(total // 10, 2000), concurrency, "warm-up")
    server = redis.Redis.from_url(settings.redis_url) if settings.redis_url else None
    before = (_server_cpu(server), _commands(server)) if server else (0.0, 0)
    figures = await closed_loop(admit, total, concurrency, name)
    if server is not None:
        figures.server_cpu_us = (_server_cpu(server) - before[0]) / total * 1e6
        figures.redis_commands = (_commands(server) - before[1]) / total
        server.close()
    await service.close()
    return figures


async def in_process(total: int, concurrency: int) -> list[Figures]:
    async def nothing(n: int) -> None:
        return None

    baseline = await closed_loop(nothing, total, concurrency, "baseline: empty async call")
    measured = []
    for buckets in (False, True):
        with tempfile.TemporaryDirectory() as data:
            measured.append(await admissions(StoreSettings(data_dir=Path(data)), total, concurrency,
                                             "embedded store" + (", buckets on" if buckets else ""), buckets))
    return [baseline, *measured]


def _server_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _commands(client: redis.Redis) -> int:
    """Script calls the client sent (commands run inside a script count separately in INFO)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval"))


def against_redis(url: str, total: int, concurrency: int) -> list[Figures]:
    async def trivial_script() -> Figures:
        client = redis.asyncio.Redis.from_url(url, decode_responses=True)
        batch, script = ScriptBatcher(client), client.register_script("return 1")
        await batch.call(script, [], [])  # loads the script outside the measurement

        async def call(n: int) -> None:
            await batch.call(script, ["tg:{bench}:x"], [n])

        server = redis.Redis.from_url(url)
        before = (_server_cpu(server), _commands(server))
        figures = await closed_loop(call, total, concurrency, "baseline: `return 1` script, same batching")
        figures.server_cpu_us = (_server_cpu(server) - before[0]) / total * 1e6
        figures.redis_commands = (_commands(server) - before[1]) / total
        server.close()
        await client.aclose()
        return figures

    with tempfile.TemporaryDirectory() as data:
        settings = StoreSettings(redis_url=url, data_dir=Path(data))
        return [asyncio.run(trivial_script()), asyncio.run(admissions(settings, total, concurrency, "Redis store")),
                asyncio.run(admissions(settings, total, concurrency, "Redis store, buckets on", buckets=True))]


@contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway redis-server on a free loopback port, without persistence."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed; pass --redis-url")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as workdir:
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir,
                                 "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        try:
            client = redis.Redis(port=port)
            for _ in range(100):
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--admissions", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--redis-url", help="an existing Redis (its data is left in place); default: start one")
    parser.add_argument("--skip-redis", action="store_true")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    results = asyncio.run(in_process(args.admissions, args.concurrency))
    if not args.skip_redis:
        if args.redis_url:
            results += against_redis(args.redis_url, args.admissions, args.concurrency)
        else:
            with redis_server() as url:
                results += against_redis(url, args.admissions, args.concurrency)
    print(f"{'run':44} {'adm/s':>9} {'cpu µs':>7} {'p50 ms':>7} {'p99 ms':>7} {'srv µs':>7} {'cmds':>5}")
    for f in results:
        server = f"{f.server_cpu_us:7.1f} {f.redis_commands:5.2f}" if f.server_cpu_us is not None else ""
        print(f"{f.name:44} {f.per_second:9.0f} {f.client_cpu_us:7.1f} {f.p50_ms:7.2f} {f.p99_ms:7.2f} {server}")
    if args.json:
        args.json.write_text(json.dumps([asdict(f) for f in results], indent=2))


if __name__ == "__main__":
    main()
