"""The request id both tiers log and answer with: a sane caller's id is kept, anything else replaced."""

from __future__ import annotations

from common.request_id import request_id


def test_a_sane_caller_request_id_is_kept_and_anything_else_replaced() -> None:
    assert request_id({"x-request-id": "gw-123.abc"}) == "gw-123.abc"
    for bad in ("", "has space", "x" * 200, "inject\nline", "with:colon"):
        fresh = request_id({"x-request-id": bad})
        assert fresh != bad and len(fresh) == 32
    assert len(request_id({})) == 32
