from __future__ import annotations

import pytest
import redis
import redis.exceptions

from tests.servers import RedisServer


def test_redis_round_trip_and_restart(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url)
    assert client.set("tidegate:probe", "1") and client.get("tidegate:probe") == b"1"
    redis_server.kill()
    with pytest.raises(redis.exceptions.ConnectionError):
        client.ping()
    redis_server.start()  # same port, empty data: nothing is persisted between runs
    assert client.ping() and client.get("tidegate:probe") is None
    client.close()
