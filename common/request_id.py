"""The id a request is known by in logs, traces, the usage ledger and the answer's `x-request-id`."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping

# what a proxy or client library generates (uuids, hex, ULIDs); anything else is the client's to keep
CLIENT_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def request_id(headers: Mapping[str, str]) -> str:
    """The client's `x-request-id` when it is at most 128 characters of `[A-Za-z0-9._-]`, else a new one."""
    given = headers.get("x-request-id")
    if given is not None and CLIENT_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex
