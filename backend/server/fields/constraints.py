"""Structured-output fields of a request: `response_format`, vLLM's `structured_outputs` and older `guided_*`.

Each becomes one `Constraint` (or none), checked against the limits below; what the grammar engine could not
enforce (keywords it would silently ignore, remote `$ref`s) is refused with a 400 that names the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from backend.engine.structured_output import Constraint, ConstraintKind
from backend.server.api_errors import invalid

MAX_SCHEMA_BYTES = 32 * 1024
MAX_PATTERN_CHARS = 4096
MAX_GRAMMAR_BYTES = 32 * 1024
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 512
# JSON Schema keywords xgrammar accepts but does not enforce: output could then fail the schema.
UNSUPPORTED_KEYWORDS = frozenset({
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "contains",
    "minContains", "maxContains", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef",
})
_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_STRUCTURED_KINDS = {"json": ConstraintKind.JSON_SCHEMA, "regex": ConstraintKind.REGEX,
                     "choice": ConstraintKind.CHOICE, "grammar": ConstraintKind.GRAMMAR}
_GUIDED = {"guided_json": ConstraintKind.JSON_SCHEMA, "guided_regex": ConstraintKind.REGEX,
           "guided_choice": ConstraintKind.CHOICE, "guided_grammar": ConstraintKind.GRAMMAR}


def parse_constraint(body: dict[str, Any]) -> Constraint | None:
    """The request's one output constraint; two at once (say `response_format` and `guided_regex`) is a 400."""
    found = [c for c in (_response_format(body.get("response_format")),
                         _structured_outputs(body.get("structured_outputs")),
                         *(_constraint(kind, body[name], name) for name, kind in _GUIDED.items()
                           if body.get(name) is not None)) if c is not None]
    if len(found) > 1:
        raise invalid(f"`{found[1].field}` cannot be combined with `{found[0].field}`: "
                      "a request takes one output constraint", found[1].field)
    return found[0] if found else None


def json_schema_constraint(schema: Any, field: str) -> Constraint:
    """A JSON Schema (object) as a constraint, within the size limit and the enforceable keywords."""
    if isinstance(schema, bool) or not isinstance(schema, dict):
        raise invalid(f"`{field}` must be a JSON Schema object", field)
    source = json.dumps(schema, sort_keys=True)
    if len(source.encode()) > MAX_SCHEMA_BYTES:
        raise invalid(f"`{field}` is {len(source.encode())} bytes as JSON; at most {MAX_SCHEMA_BYTES} are "
                      "supported", field)
    for path, keyword, value in _keywords(schema, field):
        if keyword in UNSUPPORTED_KEYWORDS:
            raise invalid(f"`{path}.{keyword}` is a JSON Schema keyword this server cannot enforce; supported "
                          "are type, properties, required, items, enum, const, anyOf, oneOf, allOf, $ref to "
                          "#/$defs, pattern, format, string/number/array/object bounds", f"{path}.{keyword}")
        if keyword == "$ref" and not (isinstance(value, str) and value.startswith("#")):
            raise invalid(f"`{path}.$ref` must point inside the schema (start with \"#\")", f"{path}.$ref")
    return Constraint(ConstraintKind.JSON_SCHEMA, source, field)


def _response_format(value: Any) -> Constraint | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(ConstraintKind.JSON_OBJECT, "", "response_format")
    if kind != "json_schema":
        raise invalid("`response_format.type` must be one of text, json_object, json_schema",
                      "response_format.type")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid("`response_format.json_schema` must be an object with `name` and `schema`",
                      "response_format.json_schema")
    name = spec.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
        raise invalid("`response_format.json_schema.name` must be 1-64 letters, digits, `_` or `-`",
                      "response_format.json_schema.name")
    if spec.get("strict") is not None and not isinstance(spec.get("strict"), bool):
        raise invalid("`response_format.json_schema.strict` must be a boolean", "response_format.json_schema.strict")
    # Output always follows the schema, strict or not: the grammar engine enforces it token by token.
    schema = spec.get("schema", {"type": "object"})
    return json_schema_constraint(schema, "response_format.json_schema.schema")


def _structured_outputs(value: Any) -> Constraint | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("`structured_outputs` must be an object with one of json, regex, choice, grammar",
                      "structured_outputs")
    set_keys = [k for k, v in value.items() if v is not None and k in _STRUCTURED_KINDS]
    unknown = sorted(k for k, v in value.items() if v is not None and k not in _STRUCTURED_KINDS)
    if unknown:
        raise invalid(f"`structured_outputs.{unknown[0]}` is not supported; use one of json, regex, choice, "
                      "grammar", f"structured_outputs.{unknown[0]}")
    if len(set_keys) != 1:
        raise invalid("`structured_outputs` must set exactly one of json, regex, choice, grammar",
                      "structured_outputs")
    key = set_keys[0]
    return _constraint(_STRUCTURED_KINDS[key], value[key], f"structured_outputs.{key}")


def _constraint(kind: ConstraintKind, value: Any, field: str) -> Constraint:
    if kind is ConstraintKind.JSON_SCHEMA:
        if isinstance(value, str):  # vLLM takes the schema as a JSON string too
            try:
                value = json.loads(value)
            except ValueError:
                raise invalid(f"`{field}` is a string but not valid JSON", field) from None
        return json_schema_constraint(value, field)
    if kind is ConstraintKind.CHOICE:
        if (not isinstance(value, list) or not value or len(value) > MAX_CHOICES
                or not all(isinstance(c, str) and 0 < len(c) <= MAX_CHOICE_CHARS for c in value)):
            raise invalid(f"`{field}` must be a list of 1 to {MAX_CHOICES} non-empty strings of at most "
                          f"{MAX_CHOICE_CHARS} characters", field)
        return Constraint(kind, json.dumps(value), field)
    limit = MAX_PATTERN_CHARS if kind is ConstraintKind.REGEX else MAX_GRAMMAR_BYTES
    if not isinstance(value, str) or not value or len(value) > limit:
        raise invalid(f"`{field}` must be a non-empty string of at most {limit} characters", field)
    return Constraint(kind, value, field)


def _keywords(schema: Any, path: str) -> Iterator[tuple[str, str, Any]]:
    """Every (path, keyword, value) of a schema's objects, depth first; property names are not keywords."""
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            yield from _keywords(item, f"{path}[{i}]")
    elif isinstance(schema, dict):
        for key, value in schema.items():
            yield path, key, value
            if key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(value, dict):
                for name, sub in value.items():
                    yield from _keywords(sub, f"{path}.{key}.{name}")
            elif key not in ("enum", "const", "default", "examples", "required"):
                yield from _keywords(value, f"{path}.{key}")
