"""The console's answers forbid framing and allow only its own files: the headers a real gateway sends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

from gateway.admin.console import STATIC_DIR
from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import MockUpstream

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]


async def test_every_console_answer_carries_a_csp_without_inline_code_and_denies_framing(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    files = ["", *sorted(p.name for p in STATIC_DIR.iterdir())]
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        answers = [await client.get("/admin/ui"), *[await client.get(f"/admin/ui/{name}") for name in files],
                   await client.get("/admin/ui/missing.js")]
    for answer in answers:
        policy = answer.headers["content-security-policy"]
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
        assert directives["frame-ancestors"] == "'none'" and answer.headers["x-frame-options"] == "DENY"
        assert directives["default-src"] == "'none'" and directives["script-src"] == "'self'"
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy and "*" not in policy
        assert answer.headers["x-content-type-options"] == "nosniff"
    assert [a.status_code for a in answers[:2]] == [308, 200] and answers[-1].status_code == 404
    # the page itself needs nothing inline: one module script by file, no inline handlers or styles
    page = (STATIC_DIR / "index.html").read_text()
    assert page.count("<script") == 1 and '<script type="module" src="console.js"></script>' in page
    assert " style=" not in page and " onclick=" not in page
