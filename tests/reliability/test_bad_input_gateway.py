"""Bad input against a gateway process: schemathesis over its /openapi.json, then hand-written cases.

Whatever arrives, the answer is never a 5xx, and every error is in the OpenAI shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.reliability.fuzzing import assert_openai_error, fuzz
from tests.reliability.processes import ADMIN_KEY, GatewayProcess
from tests.reliability.stack import gateway_over_instant_upstream


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, str, str]]:
    with gateway_over_instant_upstream(tmp_path_factory.mktemp("bad-input"), chunks=3) as gateway:
        _, secret = gateway.new_key()
        revoked_id, revoked = gateway.new_key()
        with gateway.admin() as admin:
            assert admin.delete(f"/admin/keys/{revoked_id}").status_code in (200, 204)
        yield gateway, secret, revoked


def test_fuzzed_requests_never_get_a_5xx(stack: tuple[GatewayProcess, str, str]) -> None:
    gateway, secret, _ = stack
    calls = fuzz(gateway.url, lambda path: ADMIN_KEY if path.startswith("/admin") else secret, examples=10)
    assert calls >= 100


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **extra}


def _nested(depth: int) -> bytes:
    return b'{"model": "smollm2", "messages": ' + b"[" * depth + b"]" * depth + b"}"


BAD = [
    ("10 MB body", b'{"model": "smollm2", "x": "' + b"a" * 10_000_000 + b'"}', {}, 413),
    ("invalid UTF-8", b'{"model": "smollm2", "messages": [{"role": "user", "content": "\xff\xfe"}]}', {}, 400),
    ("deeply nested JSON", _nested(100_000), {}, 400),
    ("not JSON", b"model=smollm2", {}, 400),
    ("JSON array", b"[1, 2, 3]", {}, 400),
    ("empty body", b"", {}, 400),
    ("wrong content type", json.dumps(_chat()).encode(), {"content-type": "text/plain"}, None),
    ("huge max_tokens", json.dumps(_chat(max_tokens=10**12)).encode(), {}, None),
    ("negative max_tokens", json.dumps(_chat(max_tokens=-5)).encode(), {}, 400),
    ("negative temperature", json.dumps(_chat(temperature=-1)).encode(), {}, None),
    ("unknown fields", json.dumps(_chat(frobnicate={"a": 1})).encode(), {}, None),
    ("messages not a list", json.dumps(_chat(messages="hi")).encode(), {}, 400),
    ("model not a string", json.dumps(_chat(model=7)).encode(), {}, 400),
    ("unknown model", json.dumps(_chat(model="no-such-model")).encode(), {}, 404),
    ("stream not a bool", json.dumps(_chat(stream="yes")).encode(), {}, 400),
]


@pytest.mark.parametrize(("name", "body", "headers", "expected"), BAD, ids=[case[0] for case in BAD])
def test_hand_written_bad_bodies(stack: tuple[GatewayProcess, str, str], name: str, body: bytes,
                                 headers: dict[str, str], expected: int | None) -> None:
    gateway, secret, _ = stack
    response = httpx.post(f"{gateway.url}/v1/chat/completions", content=body, timeout=60,
                          headers={"authorization": f"Bearer {secret}", "content-type": "application/json",
                                   **headers})
    assert_openai_error(response)
    if expected is not None:
        assert response.status_code == expected, (name, response.status_code, response.text[:300])


@pytest.mark.parametrize(
    ("authorization", "expected"),
    [(None, 401), ("", 401), ("Bearer", 401), ("Basic dXNlcjpwYXNz", 401), ("Bearer tg-not-a-real-key", 401),
     ("Bearer " + "x" * 10_000, 401), ("Bearer \u00e9t\u00e9", 401)],
)
def test_missing_or_malformed_authorization(stack: tuple[GatewayProcess, str, str], authorization: str | None,
                                            expected: int) -> None:
    gateway, _, _ = stack
    headers: dict[str, bytes] = {} if authorization is None else {"authorization": authorization.encode()}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=_chat(), headers=headers, timeout=30)
    assert response.status_code == expected
    assert_openai_error(response)


def test_revoked_key_and_disallowed_model_are_refused(stack: tuple[GatewayProcess, str, str]) -> None:
    gateway, _, revoked = stack
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=_chat(),
                          headers={"authorization": f"Bearer {revoked}"}, timeout=30)
    assert response.status_code in (401, 403)
    assert_openai_error(response)
    _, narrow = gateway.new_key(models=["some-other-model"])
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=_chat(),
                          headers={"authorization": f"Bearer {narrow}"}, timeout=30)
    assert response.status_code == 403
    assert_openai_error(response)


def test_admin_api_refuses_bad_keys_and_bodies(stack: tuple[GatewayProcess, str, str]) -> None:
    gateway, secret, _ = stack
    for token in (secret, "wrong-admin-key"):
        response = httpx.get(f"{gateway.url}/admin/accounts", headers={"authorization": f"Bearer {token}"})
        assert response.status_code == 401
        assert_openai_error(response)
    with gateway.admin() as admin:
        for body in (b"{", b"[]", b'{"name": 5}', b'{"name": "a", "quota": {"rpm": -1}}',
                     b'{"name": "a", "quota": {"rpm": "many"}}', b'{"name": "a", "nonsense": 1}'):
            response = admin.post("/admin/accounts", content=body, headers={"content-type": "application/json"})
            assert response.status_code == 400, (body, response.status_code, response.text)
            assert_openai_error(response)
        response = admin.post("/admin/keys", json={"account_id": "does-not-exist"})
        assert response.status_code in (400, 404)
        assert_openai_error(response)
