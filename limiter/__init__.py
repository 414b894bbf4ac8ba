"""Rate-limit algorithms (token bucket, sliding and fixed windows, concurrency leases), in memory and in Redis."""

from limiter.leases import LeaseSet
from limiter.lua import compose, libraries
from limiter.redis_limiter import RedisLimiter
from limiter.token_bucket import BucketTake, TokenBucket
from limiter.windows import FixedWindow, SlidingWindow, WindowCheck

__all__ = [
    "BucketTake",
    "FixedWindow",
    "LeaseSet",
    "RedisLimiter",
    "SlidingWindow",
    "TokenBucket",
    "WindowCheck",
    "compose",
    "libraries",
]
