"""Credentials inside URLs (`https://user:pass@host/...?api_key=...`): redacted wherever a URL is logged or shown,
and split off where a URL is used, so that a library's own request log cannot print them either."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "***"
SECRET_QUERY_NAMES = re.compile(r"key|token|secret|password|passwd|sig|auth|credential", re.IGNORECASE)


def redact_url(url: str) -> str:
    """`url` with its user, password and secret-looking query values replaced by `***`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED  # not a URL we can take apart: show none of it
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, REDACTED if SECRET_QUERY_NAMES.search(k) else v) for k, v in pairs], safe="*")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """(the URL without user and password, (user, password) for HTTP basic auth, or None when it had none)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=host)), (parts.username or "", parts.password or "")
