"""What a Redis call raises when Redis (one server or a cluster) is out of reach: the Redis-down policy's trigger."""

from __future__ import annotations

import asyncio

from redis.exceptions import RedisClusterException, RedisError

# redis-py raises RedisClusterException, which is no RedisError, when no seed node of a cluster answers
REDIS_DOWN = (RedisError, RedisClusterException, OSError, asyncio.TimeoutError)
