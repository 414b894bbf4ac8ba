"""Opens the Redis client that `redis_url` names: one server, or a Redis Cluster through redis-py's cluster
client, which follows MOVED and ASK and re-reads the slot map after a failover (see config/redis_url.py)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterNode, ClusterPipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from config.redis_url import ClusterUrl, cluster_url

RedisClient = Redis | RedisCluster
RedisPipeline = Pipeline | ClusterPipeline
POOL_SIZE = 16
POOL_WAIT = 5.0  # waiting for a free connection is queueing, not an outage


def open_cluster(url: ClusterUrl, *, timeout: float, decode_responses: bool = False,
                 fail_fast: bool = False) -> RedisCluster:
    """A cluster client over `url`'s seed nodes. `fail_fast`: an unreachable node raises at once instead of
    being retried, so the caller's Redis-down policy applies as for one server."""
    extra: dict[str, Any] = {"retry": Retry(NoBackoff(), 0)} if fail_fast else {}
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in url.seeds], ssl=url.tls,
        username=url.username, password=url.password, decode_responses=decode_responses,
        socket_timeout=timeout, socket_connect_timeout=timeout, **extra,
    )


def open_redis(url: str, *, timeout: float, decode_responses: bool = False) -> RedisClient:
    """A client for a single server or a cluster, whichever `url` names."""
    cluster = cluster_url(url)
    if cluster is not None:
        return open_cluster(cluster, timeout=timeout, decode_responses=decode_responses)
    return Redis.from_url(url, socket_timeout=timeout, decode_responses=decode_responses)


def open_store_client(url: str, timeout: float) -> RedisClient:
    """The quota store's client: an unreachable Redis raises at once, so the Redis-down policy applies."""
    cluster = cluster_url(url)
    if cluster is not None:
        return open_cluster(cluster, timeout=timeout, decode_responses=True, fail_fast=True)
    # A bounded pool: a burst of admissions queues for a connection instead of opening thousands.
    pool = BlockingConnectionPool.from_url(url, max_connections=POOL_SIZE, timeout=POOL_WAIT, decode_responses=True,
                                           socket_timeout=timeout, socket_connect_timeout=timeout)
    return Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))


async def close_client(client: RedisClient) -> None:
    if isinstance(client, Redis):
        await client.aclose(close_connection_pool=True)  # a pool made by open_store_client, not by the client
    else:
        await client.aclose()


def multi_record_writes(client: RedisClient) -> RedisPipeline:
    """A pipeline for writes that touch several records: one MULTI on a single server; on a cluster, whose
    records lie in different slots and no MULTI may span slots, a plain pipeline (each write idempotent, so a
    failed admin call is simply repeated)."""
    return client.pipeline(transaction=not isinstance(client, RedisCluster))
