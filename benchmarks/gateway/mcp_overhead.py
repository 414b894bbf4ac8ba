"""What the gateway's /mcp hop adds to an MCP tool call: the same calls, at the same concurrency, straight to an
MCP server and through a `tidegate gateway` in front of it; the added median (and P95) latency per call and the
gateway's CPU time per call (its process's user + system time over the run, divided by the calls).

The tool server is the tests' SDK server (`tests/gateway/mcp/tool_server.py`, its `echo` tool); the gateway runs
with the embedded store and one worker; each of the `--concurrency` clients is the official MCP client holding one
session and calling in a loop. Everything shares the machine: read the difference within one run.

    .venv/bin/python -m benchmarks.gateway.mcp_overhead --concurrency 32 --calls 1600
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import httpx2
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.servers import ChildProcess, free_port, tidegate_argv

ADMIN_KEY = "mcp-overhead-admin-5c1e9a7f3b2d8046e4a1"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_calls(url: str, tool: str, headers: dict[str, str], concurrency: int, calls: int) -> list[float]:
    """Seconds per call, `calls` in all, over `concurrency` sessions each calling in turn."""
    latencies: list[float] = []
    remaining = calls

    async def worker() -> None:
        nonlocal remaining
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http, \
                Client(streamable_http_client(url, http_client=http), cache=None) as client:
            await client.list_tools()
            while remaining > 0:
                remaining -= 1
                started = time.perf_counter()
                result = await client.call_tool(tool, {"text": "hello"})
                latencies.append(time.perf_counter() - started)
                assert not result.is_error

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


def summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {"median_ms": round(statistics.median(ordered) * 1000, 2),
            "p95_ms": round(ordered[int(len(ordered) * 0.95) - 1] * 1000, 2)}


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, object]:
    tool_port, gateway_port = free_port(), free_port()
    tool = ChildProcess([sys.executable, "-m", "tests.gateway.mcp.tool_server", "bench", str(tool_port)],
                        workdir / "tool.log", tool_port).start(health_timeout=60)
    config = workdir / "gateway.yaml"
    config.write_text(yaml.safe_dump({"admin_key": ADMIN_KEY, "data_dir": str(workdir / "data"), "port": gateway_port,
                                      "metrics_public": True, "log_level": "warning",
                                      "mcp_servers": [{"name": "bench", "url": f"{tool.url}/mcp"}]}))
    gateway = ChildProcess(tidegate_argv("gateway", "--config", str(config)), workdir / "gateway.log",
                           gateway_port).start(health_timeout=60)
    try:
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        account = httpx.post(f"{gateway.url}/admin/accounts", json={"name": "bench"}, headers=admin).json()["id"]
        secret = httpx.post(f"{gateway.url}/admin/keys", json={"account_id": account}, headers=admin).json()["key"]
        results: dict[str, object] = {"concurrency": args.concurrency, "calls": args.calls}
        for name, url, tool_name, headers in (
                ("direct", f"{tool.url}/mcp", "echo", {}),
                ("gateway", f"{gateway.url}/mcp", "bench__echo", {"authorization": f"Bearer {secret}"})):
            await run_calls(url, tool_name, headers, args.concurrency, args.concurrency * 4)  # warm up
            assert gateway.proc is not None
            cpu, started = cpu_seconds(gateway.proc.pid), time.perf_counter()
            latencies = await run_calls(url, tool_name, headers, args.concurrency, args.calls)
            elapsed = time.perf_counter() - started
            stats = {**summary(latencies), "calls_per_s": round(len(latencies) / elapsed, 1)}
            if name == "gateway":
                stats["gateway_cpu_ms_per_call"] = round((cpu_seconds(gateway.proc.pid) - cpu) / len(latencies)
                                                         * 1000, 3)
            results[name] = stats
        direct, through = results["direct"], results["gateway"]
        assert isinstance(direct, dict) and isinstance(through, dict)
        results["added_median_ms"] = round(through["median_ms"] - direct["median_ms"], 2)
        results["load_average"] = os.getloadavg()
        return results
    finally:
        gateway.stop()
        tool.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--calls", type=int, default=1600)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        print(json.dumps(asyncio.run(measure(args, Path(workdir)))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
