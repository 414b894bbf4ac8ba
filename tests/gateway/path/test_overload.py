"""An upstream shedding load (503 with Retry-After) is busy, not broken."""

from __future__ import annotations

import pytest

from common.http_client import HttpClient
from gateway.errors import ApiError
from tests.gateway.path.test_upstream import Start, channel, client_for, request
from tests.gateway.upstreams import Fault


async def test_an_overloaded_upstream_fails_over_and_keeps_its_breaker_closed(
        upstreams: Start, session: HttpClient) -> None:
    shedding, healthy = await upstreams(Fault.overloaded), await upstreams()
    states = [channel("shedding", shedding.base_url), channel("healthy", healthy.base_url)]
    client = client_for(session, states)
    for _ in range(6):
        answer = await client.call(request())
        await answer.finish(True)
    assert healthy.completed == 6
    assert states[0].breaker("m").state.value == "closed"


async def test_overload_everywhere_is_a_503_with_retry_after_not_a_502(
        upstreams: Start, session: HttpClient) -> None:
    shedding = await upstreams(Fault.overloaded)
    state = channel("shedding", shedding.base_url)
    with pytest.raises(ApiError) as refused:
        await client_for(session, [state], attempts=2).call(request())
    assert refused.value.status == 503 and "retry-after" in refused.value.headers
    assert state.breaker("m").state.value == "closed"
