"""`tidegate gateway` as real processes: two replicas sharing one Redis hold a limit (window, bucket) exactly."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.gateway.harness import ADMIN_KEY
from tests.gateway.upstreams import MockUpstream
from tests.redis_cluster import RedisClusterServers
from tests.servers import RedisServer, free_port, wait_for_health
from tests.waiting import wait_until_async

Start = Callable[..., Awaitable[MockUpstream]]


def start_gateway(config: dict[str, object], workdir: Path, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    """A `tidegate gateway` process from a YAML config, and its URL once healthy."""
    port = free_port()
    path = workdir / f"gateway-{port}.yaml"
    # its own data dir: the generated metrics token and cache-salt secret stay out of the user's
    path.write_text(yaml.safe_dump({"data_dir": str(workdir / "data"), **config}))
    proc = subprocess.Popen([sys.executable, "-m", "tidegate.cli", "gateway", "--config", str(path),
                             "--port", str(port), *flags], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url + "/health", timeout=60, proc=proc)
    return proc, url


@pytest.fixture
def spawn_gateway(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Starts `tidegate gateway` processes from a YAML config; returns each one's URL once healthy."""
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(config: dict[str, object], *flags: str) -> str:
        proc, url = start_gateway(config, tmp_path, *flags)
        procs.append(proc)
        return url

    yield spawn
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def two_gateways(spawn_gateway: Callable[..., str], upstream: MockUpstream, redis_url: str,
                       second_workers: int = 2) -> list[str]:
    """Two gateway replicas on one store, in front of `upstream`."""
    # access lines at warning: the fixture never reads stderr, and a full pipe would stall a replica
    config = {"admin_key": ADMIN_KEY, "redis_url": redis_url, "health_check_interval": 60, "log_level": "warning",
              "channels": [{"name": "mock", "base_url": upstream.base_url, "models": ["smollm2"]}],
              "priority_classes": {"realtime": {"max_concurrency": 256, "queue_size": 256, "queue_timeout": 30}}}
    return list(await asyncio.gather(asyncio.to_thread(spawn_gateway, config),
                                     asyncio.to_thread(spawn_gateway, config, "--workers", str(second_workers))))


async def test_two_gateways_sharing_redis_admit_exactly_the_rpm_under_200_concurrent_requests(
        upstreams: Start, redis_server: RedisServer, spawn_gateway: Callable[..., str]) -> None:
    upstream = await upstreams()
    urls = await two_gateways(spawn_gateway, upstream, redis_server.url)
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=256)) as http:
        account = (await http.post(f"{urls[0]}/admin/accounts", json={"name": "a"}, headers=admin)).json()
        created = await http.post(f"{urls[1]}/admin/keys", json={"account_id": account["id"], "quota": {"rpm": 30}},
                                  headers=admin)
        secret, key_id = created.json()["key"], created.json()["id"]
        body = {"model": "smollm2", "prompt": "hi", "max_tokens": 1}

        async def one(i: int) -> int:
            response = await http.post(f"{urls[i % 2]}/v1/completions", json=body,
                                       headers={"authorization": f"Bearer {secret}"})
            return response.status_code

        statuses = Counter(await asyncio.gather(*(one(i) for i in range(200))))
        assert statuses == {200: 30, 429: 170}
        assert upstream.completed == 30
        usage = (await http.get(f"{urls[0]}/admin/usage", params={"key_id": key_id}, headers=admin)).json()
        assert usage["requests"] == 30

        # a request bucket of burst 10 and 2/s: 10 at once, then about 2 a second, across both replicas
        created = await http.post(f"{urls[0]}/admin/keys", headers=admin, json={
            "account_id": account["id"], "quota": {"request_bucket": {"rate": 2, "burst": 10}}})
        secret = created.json()["key"]
        started = asyncio.get_running_loop().time()
        burst = Counter(await asyncio.gather(*(one(i) for i in range(100))))
        assert 10 <= burst[200] <= 10 + 2 * (asyncio.get_running_loop().time() - started) and burst[429] >= 80
        admitted = burst[200]
        rounds = 0
        while asyncio.get_running_loop().time() - started < 4.0:
            rounds += 1
            admitted += Counter(await asyncio.gather(one(0), one(1)))[200]
            await asyncio.sleep(0.05)
        elapsed = asyncio.get_running_loop().time() - started
        assert 10 + 2 * (elapsed - 1.0) - 1 <= admitted <= 10 + 2 * elapsed + 1


async def test_sigterm_stops_accepting_but_lets_a_stream_in_flight_finish(upstreams: Start,
                                                                           tmp_path: Path) -> None:
    # a stream of about 7 s: longer than uvicorn's 5 s default drain, well within timeouts.total
    upstream = await upstreams(chunk_delay=0.9)
    config = {"admin_key": ADMIN_KEY, "data_dir": str(tmp_path), "health_check_interval": 60,
              "log_level": "warning",
              "channels": [{"name": "mock", "base_url": upstream.base_url, "models": ["smollm2"]}]}
    proc, url = await asyncio.to_thread(start_gateway, config, tmp_path)
    try:
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        async with httpx.AsyncClient(timeout=60) as http:
            account = (await http.post(f"{url}/admin/accounts", json={"name": "a"}, headers=admin)).json()
            secret = (await http.post(f"{url}/admin/keys", json={"account_id": account["id"]},
                                      headers=admin)).json()["key"]
            body = {"model": "smollm2", "prompt": "hi", "max_tokens": 8, "stream": True}
            async with http.stream("POST", f"{url}/v1/completions", json=body,
                                   headers={"authorization": f"Bearer {secret}"}) as response:
                lines = response.aiter_lines()
                received = [await anext(lines)]
                proc.terminate()

                async def refuses_connections() -> bool:
                    try:
                        await http.get(f"{url}/health")
                    except httpx.ConnectError:
                        return True
                    except (httpx.RemoteProtocolError, httpx.ReadError):  # accepted while the listener was closing
                        return False
                    return False

                # the signal is handled on the gateway's event loop: wait until its listener is closed
                await wait_until_async(refuses_connections, timeout=10, what="the gateway refusing new connections")
                received += [line async for line in lines]
        events = [line.removeprefix("data: ") for line in received if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e)["choices"]) \
            == "".join(f"t{i} " for i in range(8))
        # uvicorn raises the signal again once its shutdown is complete, as a process killed by it would end
        assert await asyncio.to_thread(proc.wait, 30) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_two_gateways_on_a_redis_cluster_never_admit_over_the_rpm_or_the_tpm(
        upstreams: Start, redis_cluster: RedisClusterServers, spawn_gateway: Callable[..., str]) -> None:
    upstream = await upstreams()
    urls = await two_gateways(spawn_gateway, upstream, redis_cluster.url, second_workers=1)
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=256)) as http:
        account = (await http.post(f"{urls[0]}/admin/accounts", json={"name": "a"}, headers=admin)).json()

        async def burst(quota: dict[str, int], max_tokens: int) -> tuple[Counter[int], dict[str, int]]:
            created = (await http.post(f"{urls[1]}/admin/keys", json={"account_id": account["id"], "quota": quota},
                                       headers=admin)).json()
            body = {"model": "smollm2", "prompt": "hi", "max_tokens": max_tokens}
            headers = {"authorization": f"Bearer {created['key']}"}
            statuses = Counter(r.status_code for r in await asyncio.gather(*(
                http.post(f"{urls[i % 2]}/v1/completions", json=body, headers=headers) for i in range(100))))
            usage = await http.get(f"{urls[0]}/admin/usage", params={"key_id": created["id"]}, headers=admin)
            return statuses, usage.json()

        statuses, usage = await burst({"rpm": 25}, 1)
        assert statuses == {200: 25, 429: 75} and usage["requests"] == 25
        statuses, usage = await burst({"tpm": 1000}, 50)  # about 50 tokens a request: some 20 fit
        assert 10 <= statuses[200] <= 20 and statuses[200] + statuses[429] == 100
        assert usage["prompt_tokens"] + usage["completion_tokens"] <= 1000
