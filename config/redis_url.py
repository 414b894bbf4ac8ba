"""What `redis_url` names: one server (`redis://`, `rediss://`, `unix://`, as redis-py reads them), or a Redis
Cluster by its seed nodes (`redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]`, `rediss+cluster://` for
TLS)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}  # scheme -> TLS


@dataclass(slots=True, frozen=True)
class ClusterUrl:
    seeds: tuple[tuple[str, int], ...]
    tls: bool = False
    username: str | None = None
    password: str | None = None


def cluster_url(url: str) -> ClusterUrl | None:
    """The seed nodes and credentials of a cluster URL; None for any other URL. Raises ValueError when a
    cluster URL names no seed node, or a seed node without its port."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in CLUSTER_SCHEMES:
        return None
    rest = rest.split("/", 1)[0].split("?", 1)[0]  # a cluster has only database 0: a path would mislead
    userinfo, at, hosts = rest.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) if colon else None)
    seeds = []
    for seed in filter(None, (s.strip() for s in hosts.split(","))):
        host, colon, port = seed.rpartition(":")
        if not colon or not host or not port.isdigit():
            raise ValueError(f"a cluster seed node is HOST:PORT, not {seed!r}")
        seeds.append((host.strip("[]"), int(port)))
    if not seeds:
        raise ValueError("a redis+cluster:// URL names at least one seed node HOST:PORT")
    return ClusterUrl(tuple(seeds), CLUSTER_SCHEMES[scheme.lower()], username, password)
