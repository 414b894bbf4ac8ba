"""The request id both tiers log and answer with: a sane caller's id is kept, anything else replaced."""

from __future__ import annotations

import uuid

from common.request_id import request_id


def test_a_sane_caller_request_id_is_kept_and_anything_else_replaced() -> None:
    assert request_id({"x-request-id": "gw-123.abc"}) == "gw-123.abc"
    for bad in ("", "has space", "x" * 200, "inject\nline", "with:colon"):
        fresh = request_id({"x-request-id": bad})
        assert fresh != bad and len(fresh) == 32
    assert len(request_id({})) == 32


def test_a_new_request_id_is_a_random_uuid_in_hex() -> None:
    ids = {request_id({}) for _ in range(1000)}
    assert len(ids) == 1000
    for fresh in ids:
        parsed = uuid.UUID(hex=fresh)
        assert (parsed.version, parsed.variant, parsed.hex) == (4, uuid.RFC_4122, fresh)
