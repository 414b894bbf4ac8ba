"""JSON on the request path: orjson where it reads and writes exactly what the standard library would, the
standard library for the rest, so that no value, byte or error differs, only the cost.

orjson refuses NaN, Infinity, non-string keys and lone surrogates, reads integers past 64 bits as floats and
writes NaN as `null`. So a text with a run of 19 or more digits is read by `json`, as is anything orjson refuses
(which then gets `json`'s exact value or error), and an object holding a NaN or an infinity is written by
`json`. Where orjson's output stands, it is byte for byte
`json.dumps(obj, ensure_ascii=False, separators=(",", ":"))` except the spelling of floats below 1e-4 (`1e-7`
for `1e-07`, `0.00001` for `1e-05`), which read back as the same numbers.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
from starlette.responses import JSONResponse

# an integer orjson might read as a float (past 64 bits) is a run of 19 digits; a long fraction is one too and is
# merely read by json. Found by mapping every digit to "0" and the rest to " ", then a substring search: a regular
# expression tries a match at every digit and cost 60 us on a 4 KB streamed answer, this costs 4 us.
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_RUN = b"0" * 19


def _has_long_number(data: bytes) -> bool:
    return _LONG_RUN in data.translate(_DIGITS_AS_ZERO)


def loads(data: bytes | str) -> Any:
    """`json.loads(data)`: the same value, or the same ValueError (JSONDecodeError) with the same message."""
    # a text's digits are the same bytes in UTF-8; surrogatepass encodes a lone surrogate (orjson refuses it, json reads it)
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if not _has_long_number(raw):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def loads_all(texts: list[bytes]) -> list[Any] | None:
    """`[loads(text) for text in texts]` with one digit check for all; None where one of them would not be read
    by orjson (read those one by one with `loads`, for its exact value or error)."""
    joined = b"\n".join(texts)  # a separator: no run of digits spans two texts
    if _has_long_number(joined):
        return None
    try:
        return [orjson.loads(text) for text in texts]
    except orjson.JSONDecodeError:
        return None


def dumps(obj: Any, *, allow_nan: bool = True) -> bytes:
    """`json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=allow_nan).encode()`, the same JSON
    (see above for the spelling of small floats)."""
    try:
        out = orjson.dumps(obj)
    except orjson.JSONEncodeError:
        pass
    else:
        if b"null" not in out or not _has_non_finite(obj):
            return out
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=allow_nan).encode()


def _has_non_finite(obj: Any) -> bool:
    """Whether a NaN or an infinity hides in `obj` (which orjson would have written as null)."""
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                return True
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return False


class FastJSONResponse(JSONResponse):
    """Starlette's JSONResponse (compact, non-ASCII as is, NaN refused), written through `dumps`."""

    def render(self, content: Any) -> bytes:
        return dumps(content, allow_nan=False)
