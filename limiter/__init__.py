"""The rate-limit algorithms admission uses (token bucket, sliding and fixed windows, concurrency leases), each
in memory (Python) and as a Lua library that the Redis scripts include."""

from limiter.capacity import CapacityLimit, CapacityTake, MemoryCapacity, RedisCapacity, SharedCapacity
from limiter.leases import LeaseSet
from limiter.lua import compose, libraries
from limiter.token_bucket import TokenBucket
from limiter.unreachable import REDIS_DOWN
from limiter.windows import FixedWindow, SlidingWindow, WindowCheck

__all__ = [
    "REDIS_DOWN",
    "CapacityLimit",
    "CapacityTake",
    "FixedWindow",
    "LeaseSet",
    "MemoryCapacity",
    "RedisCapacity",
    "SharedCapacity",
    "SlidingWindow",
    "TokenBucket",
    "WindowCheck",
    "compose",
    "libraries",
]
