"""A real Redis Cluster on loopback: three masters, each with one replica, built with `redis-cli --cluster create`."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.crc import key_slot

from tests.servers import RedisServer, free_port
from tests.waiting import wait_until

MASTERS = 3
NODE_TIMEOUT_MS = 2000  # how long a master may be silent before its replica takes over


@dataclass
class RedisClusterServers:
    workdir: Path
    nodes: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The `redis_url` of the cluster, naming the three first nodes as seeds."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes[:MASTERS])

    def start(self) -> RedisClusterServers:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed (apt-get install -y redis-tools)")
        for n in range(2 * MASTERS):
            self.nodes.append(RedisServer(workdir=self.workdir / f"node-{n}", extra_args=[
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-port", str(free_port()),  # not the default port + 10000, which may lie past 65535
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                "--cluster-replica-validity-factor", "0"]).start())  # any replica may take over, however stale
        subprocess.run([cli, "--cluster", "create", *(f"127.0.0.1:{node.port}" for node in self.nodes),
                        "--cluster-replicas", "1", "--cluster-yes"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, timeout=60)
        self.wait_healthy()
        return self

    def wait_healthy(self) -> None:
        """Until every running node says the cluster is ok and three masters serve all the slots."""
        def healthy() -> bool:
            running = [node for node in self.nodes if node.proc is not None]
            return all(_cluster_info(node).get("cluster_state") == "ok" for node in running) and \
                len(self.masters()) == MASTERS
        wait_until(healthy, timeout=60, what="the Redis Cluster to report cluster_state:ok with three masters",
                   interval=0.1)

    def masters(self) -> list[RedisServer]:
        return [node for node in self.nodes if node.proc is not None and _role(node) == "master"]

    def master_of(self, key: str) -> RedisServer:
        """The running master that serves `key`'s slot."""
        slot = key_slot(key.encode())
        for node in self.masters():
            client = redis.Redis(port=node.port, socket_timeout=5)
            try:
                ranges = [(int(r[0]), int(r[1])) for r in client.execute_command("CLUSTER", "SLOTS")
                          if ("127.0.0.1", node.port) == (_text(r[2][0]), int(r[2][1]))]
            finally:
                client.close()
            if any(low <= slot <= high for low, high in ranges):
                return node
        raise LookupError(f"no master serves slot {slot}")

    def flush(self) -> None:
        for node in self.masters():
            with redis.Redis(port=node.port, socket_timeout=5) as client:
                client.flushall()

    def move_slot(self, key: str, target: RedisServer, *, finish: bool) -> None:
        """Migrates `key`'s slot with its keys to `target`, as `redis-cli --cluster reshard` does; `finish=False`
        stops while the slot is still migrating, so clients get ASK, and `finish=True` completes it (MOVED)."""
        slot, source = key_slot(key.encode()), self.master_of(key)
        with redis.Redis(port=source.port, socket_timeout=5) as src, \
                redis.Redis(port=target.port, socket_timeout=5) as dst:
            source_id, target_id = _text(src.execute_command("CLUSTER", "MYID")), \
                _text(dst.execute_command("CLUSTER", "MYID"))
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
            if keys:
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
            if finish:
                for node in self.masters():
                    with redis.Redis(port=node.port, socket_timeout=5) as client:
                        client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def restart(self, node: RedisServer) -> None:
        """Brings a killed node back (it rejoins as a replica) and waits for the cluster to settle."""
        node.start()
        self.wait_healthy()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _cluster_info(node: RedisServer) -> dict[str, str]:
    client = redis.Redis(port=node.port, socket_timeout=5)
    try:
        text = _text(client.execute_command("CLUSTER", "INFO"))
    except redis.RedisError:
        return {}
    finally:
        client.close()
    return dict(line.split(":", 1) for line in text.split() if ":" in line)


def _role(node: RedisServer) -> str:
    client = redis.Redis(port=node.port, socket_timeout=5)
    try:
        return _text(client.role()[0])
    except redis.RedisError:
        return "unknown"
    finally:
        client.close()
