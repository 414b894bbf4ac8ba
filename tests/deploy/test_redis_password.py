"""Redis with a password in docker-compose.yml: Redis requires it, the gateway sends it, the file holds none; and
a real gateway on a real redis-server that requires one works through the compose-shaped URL."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import redis
import yaml

from tests.deploy.conftest import ROOT
from tests.reliability.processes import GatewayProcess
from tests.servers import RedisServer

VARIABLE = re.compile(r"\$\{TIDEGATE_REDIS_PASSWORD:\?[^}]+\}")
PASSWORD = "9c1e4b7a2d6f03858e2b7c4d1a9f6e30"


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_redis_requires_the_password_the_gateway_sends_and_the_file_holds_none() -> None:
    services = compose()["services"]
    redis_service, gateway = services["redis"], services["gateway"]
    script = " ".join(redis_service["entrypoint"])
    assert "requirepass" in script and "$$REDIS_PASSWORD" in script  # from the environment, not the command line
    env = redis_service["environment"]
    # required (compose refuses to start without it: `:?`), never a default value
    assert VARIABLE.fullmatch(env["REDIS_PASSWORD"]) and env["REDISCLI_AUTH"] == env["REDIS_PASSWORD"]
    assert redis_service["healthcheck"]["test"][1] == "redis-cli"  # authenticated through REDISCLI_AUTH
    url = gateway["environment"]["TIDEGATE_GATEWAY__REDIS_URL"]
    assert VARIABLE.sub("PW", url) == "redis://:PW@redis:6379/0"
    assert "--redis" not in gateway["command"]  # the flag would put a URL without the password first
    assert ".env" in (ROOT / ".gitignore").read_text().split()


def test_a_gateway_works_through_the_compose_url_on_a_redis_that_refuses_clients_without_it(
        tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", password=PASSWORD).start()
    try:
        with redis.Redis(port=server.port, socket_timeout=2) as anonymous, pytest.raises(redis.AuthenticationError):
            anonymous.keys("tg:*")  # the attack: read the tenancy records with no password
        template = compose()["services"]["gateway"]["environment"]["TIDEGATE_GATEWAY__REDIS_URL"]
        url = VARIABLE.sub(PASSWORD, template).replace("@redis:6379", f"@127.0.0.1:{server.port}")
        gateway = GatewayProcess.create(tmp_path, [], redis_url=url)
        gateway.start()
        try:
            _, secret = gateway.new_key()
            models = httpx.get(f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {secret}"}, timeout=10)
            assert models.status_code == 200
            with redis.Redis(port=server.port, password=PASSWORD, socket_timeout=2) as owner:
                assert owner.keys("tg:*")  # the gateway's records are there, behind the password
        finally:
            gateway.stop()
        assert PASSWORD not in gateway.log_path.read_text()
    finally:
        server.stop()
