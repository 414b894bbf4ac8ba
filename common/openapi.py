"""The OpenAPI document both tiers publish at `/openapi.json`: the OpenAI-compatible routes, and the admin API.

Written by hand (the apps are plain Starlette), and kept honest by the reliability suite, which fuzzes each
server with schemathesis against the document that server publishes.
"""

from __future__ import annotations

from typing import Any

JSON = "application/json"
_ERROR_REF = {"$ref": "#/components/schemas/Error"}

_STOP = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}]}
_SAMPLING: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1},
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "n": {"type": "integer", "minimum": 1, "maximum": 1},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "stop": _STOP,
    "seed": {"type": "integer"},
    "user": {"type": "string"},
    "ignore_eos": {"type": "boolean", "description": "extension: generate exactly max_tokens"},
    "min_tokens": {"type": "integer", "minimum": 0, "description": "extension"},
    "priority": {"description": "extension: a priority class name (gateway) or an integer (backend)",
                 "oneOf": [{"type": "string"}, {"type": "integer"}]},
}
_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"oneOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "object", "required": ["type", "text"], "properties": {
                "type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}},
        ]},
        "name": {"type": "string"},
    },
}
SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "object", "required": ["message", "type"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
    },
    "ChatCompletionRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {**_SAMPLING, "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
                       "max_completion_tokens": {"type": "integer", "minimum": 1}},
    },
    "CompletionRequest": {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {**_SAMPLING, "prompt": {"oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "string", "minLength": 1}},
        ]}},
    },
    "MessagesRequest": {
        "type": "object",
        "required": ["model", "max_tokens", "messages"],
        "properties": {
            "model": {"type": "string", "minLength": 1}, "max_tokens": {"type": "integer", "minimum": 1},
            "system": {"type": "string"}, "stream": {"type": "boolean"},
            "stop_sequences": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
            "temperature": {"type": "number", "minimum": 0, "maximum": 1},
            "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "top_k": {"type": "integer", "minimum": 1},
            "metadata": {"type": "object", "properties": {"user_id": {"type": "string"}}},
            "messages": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["role", "content"], "properties": {
                    "role": {"type": "string", "enum": ["user", "assistant"]},
                    "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]}}}},
            "tools": {"type": "array", "items": {"type": "object", "required": ["name", "input_schema"]}},
            "tool_choice": {"type": "object", "required": ["type"]},
        },
    },
    "MessagesError": {
        "type": "object",
        "required": ["type", "error"],
        "properties": {"type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"],
                                                             "properties": {"type": {"type": "string"},
                                                                            "message": {"type": "string"}}}},
    },
    "ResponseRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
            "instructions": {"type": "string"}, "max_output_tokens": {"type": "integer", "minimum": 1},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2}, "stream": {"type": "boolean"},
            "store": {"type": "boolean"}, "previous_response_id": {"type": "string"},
            "tools": {"type": "array", "items": {"type": "object"}}, "text": {"type": "object"},
        },
    },
    "EmbeddingRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {"model": {"type": "string", "minLength": 1}, "input": {"oneOf": [
            {"type": "string"}, {"type": "array", "items": {"type": "string"}}]}},
    },
    "Usage": {"type": "object", "properties": {
        "prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"},
        "total_tokens": {"type": "integer"}}},
    "Quota": {"type": "object", "properties": {
        **{name: {"type": ["integer", "null"], "minimum": 0}
           for name in ("rpm", "tpm", "max_concurrency", "tokens_per_day", "tokens_per_month")},
        "budget": {"type": ["object", "null"], "required": ["amount", "window"], "properties": {
            "amount": {"type": "number", "minimum": 0}, "window": {"type": "string"}}}}},
}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(code): {"description": "error", "content": {JSON: {"schema": _ERROR_REF}}} for code in codes}


def _post(summary: str, schema: str, *errors: int) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{schema}"}}}},
        "responses": {"200": {"description": "a completion (JSON), or server-sent events when stream is true",
                              "content": {JSON: {"schema": {"type": "object"}},
                                          "text/event-stream": {"schema": {"type": "string"}}}},
                      **_errors(*errors)},
    }}


def openai_paths(auth_errors: bool) -> dict[str, Any]:
    common = (400, 404, 413, 503) + ((401, 403, 429, 504) if auth_errors else ())
    return {
        "/v1/chat/completions": _post("Chat completion", "ChatCompletionRequest", *common),
        "/v1/completions": _post("Text completion", "CompletionRequest", *common),
        "/v1/models": {"get": {"summary": "Models this caller may use", "responses": {
            "200": {"description": "model list", "content": {JSON: {"schema": {"type": "object"}}}},
            **_errors(*((401,) if auth_errors else ()))}}},
        "/health": {"get": {"summary": "Readiness", "responses": {"200": {"description": "ready"},
                                                                   "503": {"description": "not ready"}}}},
    }


def _messages_path() -> dict[str, Any]:
    """Anthropic's Messages API (gateway only); its errors take Anthropic's shape."""
    path = _post("Anthropic Messages, served as a chat completion", "MessagesRequest")
    error = {"description": "error", "content": {JSON: {"schema": {"$ref": "#/components/schemas/MessagesError"}}}}
    path["post"]["responses"].update({str(code): error for code in (400, 401, 403, 404, 413, 429, 503, 504)})
    return path


def gateway_api_paths() -> dict[str, Any]:
    """The APIs only the gateway serves: Messages and Responses (translated to chat) and embeddings (relayed)."""
    errors = (400, 401, 403, 404, 413, 429, 503, 504)
    response_id = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    answer = {"200": {"description": "the response object, or that it was deleted",
                      "content": {JSON: {"schema": {"type": "object"}}}}, **_errors(401, 404, 503)}
    return {
        "/v1/messages": _messages_path(),
        "/v1/responses": _post("Create a response (OpenAI Responses API)", "ResponseRequest", *errors),
        "/v1/responses/{response_id}": {
            "get": {"summary": "A stored response of the caller's account", "parameters": response_id,
                    "responses": answer},
            "delete": {"summary": "Forget a stored response", "parameters": response_id, "responses": answer}},
        "/v1/embeddings": _post("Embeddings, from channels that serve them", "EmbeddingRequest", *errors),
        **batch_api_paths(),
    }


def batch_api_paths() -> dict[str, Any]:
    """OpenAI's Files and Batch APIs (docs/batch.md); a caller sees its account's and sub-account's records."""
    done = {"200": {"description": "the record, a list of them, or a file's bytes",
                    "content": {JSON: {"schema": {"type": "object"}}}}, **_errors(400, 401, 403, 404, 409, 411, 413)}
    file_id, batch_id = [_param("file_id", "path")], [_param("batch_id", "path")]
    page = [_param("limit"), _param("after")]
    upload = {"type": "object", "required": ["file", "purpose"], "properties": {
        "file": {"type": "string", "format": "binary"}, "purpose": {"type": "string", "enum": ["batch"]}}}
    batch = {"type": "object", "required": ["input_file_id", "endpoint", "completion_window"], "properties": {
        "input_file_id": {"type": "string"}, "completion_window": {"type": "string", "enum": ["24h"]},
        "endpoint": {"type": "string", "enum": ["/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                                                "/v1/responses"]},
        "metadata": {"type": ["object", "null"], "additionalProperties": {"type": "string"}}}}

    def operation(summary: str, params: list[dict[str, Any]] | None = None, body: tuple[str, Any] | None = None,
                  ) -> dict[str, Any]:
        found: dict[str, Any] = {"summary": summary, "responses": done, "parameters": params or []}
        if body is not None:
            found["requestBody"] = {"required": True, "content": {body[0]: {"schema": body[1]}}}
        return found

    return {
        "/v1/files": {"post": operation("Upload a JSONL file of batch requests", body=("multipart/form-data", upload)),
                      "get": operation("The caller's files", [*page, _param("purpose"), _param("order")])},
        "/v1/files/{file_id}": {"get": operation("One file's record", file_id),
                                "delete": operation("Delete a file and its content", file_id)},
        "/v1/files/{file_id}/content": {"get": operation("A file's bytes", file_id)},
        "/v1/batches": {"post": operation("Start a batch from an uploaded file", body=(JSON, batch)),
                        "get": operation("The caller's batches", page)},
        "/v1/batches/{batch_id}": {"get": operation("One batch, with live counts", batch_id)},
        "/v1/batches/{batch_id}/cancel": {"post": operation("Stop a batch's new lines at once", batch_id)},
    }


def _admin(method: str, summary: str, body: dict[str, Any] | None = None, ok: str = "200",
           params: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary, "security": [{"admin": []}], "responses": {
        ok: {"description": "done", "content": {JSON: {"schema": {"type": "object"}}}},
        **_errors(400, 401, 403, 404)}}
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {JSON: {"schema": body}}}
    if params:
        operation["parameters"] = params
    return {method: operation}


def _param(name: str, where: str = "query", required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required or where == "path", "schema": {"type": "string"}}


def admin_paths() -> dict[str, Any]:
    quota = {"$ref": "#/components/schemas/Quota"}
    named = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string", "minLength": 1},
                                                                    "quota": quota}}
    key = {"type": "object", "properties": {
        "account_id": {"type": "string"}, "sub_account_id": {"type": "string"}, "name": {"type": "string"},
        "models": {"type": "array", "items": {"type": "string"}}, "quota": quota,
        "priority_class": {"type": "string"}, "expires_at": {"type": "string", "format": "date-time"},
        "allowed_ips": {"type": "array", "items": {"type": "string"}}}}
    update = {"type": "object", "properties": {"quota": quota, "name": {"type": "string"}}}
    return {
        "/admin/accounts": {**_admin("post", "Create an account", named, "201"),
                            **_admin("get", "List accounts")},
        "/admin/accounts/{id}/sub-accounts": {
            **_admin("post", "Create a sub-account", named, "201", [_param("id", "path")]),
            **_admin("get", "List an account's sub-accounts", params=[_param("id", "path")])},
        "/admin/keys": {**_admin("post", "Create a key (its secret is returned once)", key, "201"),
                        **_admin("get", "List keys (never a secret)", params=[_param("account_id")])},
        "/admin/keys/{id}": {**_admin("delete", "Revoke a key", params=[_param("id", "path")]),
                             **_admin("patch", "Update a key", update, params=[_param("id", "path")])},
        "/admin/accounts/{id}": {**_admin("patch", "Update an account", update, params=[_param("id", "path")])},
        "/admin/sub-accounts/{id}": {
            **_admin("patch", "Update a sub-account", update, params=[_param("id", "path")])},
        "/admin/usage": _admin("get", "Usage by account, sub-account, key, model and time range", params=[
            _param(p) for p in ("account_id", "sub_account_id", "key_id", "model", "start", "end")]),
        **admin_access_paths(),
        **money_paths(),
        **routing_paths(),
    }


def admin_access_paths() -> dict[str, Any]:
    """Admin identities, the audit log and key rotation (docs/admin.md)."""
    admin_key = {"type": "object", "required": ["role"], "properties": {
        "role": {"type": "string", "enum": ["owner", "operator", "viewer", "account_admin"]},
        "account_id": {"type": "string"}, "name": {"type": "string"}}}
    rotate = {"type": "object", "properties": {"grace_seconds": {"type": "number", "minimum": 0}}}
    return {
        "/admin/me": _admin("get", "The calling admin key's id, role and account"),
        "/admin/keys/{id}/rotate": _admin("post", "A new secret for the key; the old one works for grace_seconds",
                                          rotate, params=[_param("id", "path")]),
        "/admin/admin-keys": {**_admin("post", "Create an admin key (its secret is returned once)", admin_key, "201"),
                              **_admin("get", "List admin keys (never a secret)")},
        "/admin/admin-keys/{id}": _admin("delete", "Revoke an admin key", params=[_param("id", "path")]),
        "/admin/audit": _admin("get", "Admin changes, newest first", params=[
            _param(p) for p in ("actor", "action", "since", "limit")]),
    }


def money_paths() -> dict[str, Any]:
    amount = {"type": "number", "minimum": 0}
    price = {"type": "object", "required": ["input", "output"], "properties": {
        "input": amount, "cached_input": amount, "output": amount, "channel": {"type": "string"},
        "effective_from": {"type": "string", "format": "date-time"}}}
    top_up = {"type": "object", "required": ["amount"], "properties": {"amount": {"type": "number"},
                                                                        "note": {"type": "string"}}}
    account = [_param("id", "path")]
    return {
        "/admin/prices": _admin("get", "Every price, oldest first"),
        "/admin/prices/{model}": _admin("put", "A model's price per million tokens from effective_from on", price,
                                        params=[_param("model", "path")]),
        "/admin/accounts/{id}/balance": {**_admin("post", "Top up or adjust a prepaid balance", top_up, "201",
                                                  account),
                                         **_admin("get", "A prepaid balance and its journal", params=account)},
        "/admin/accounts/{id}/requests": _admin("get", "Per-request audit records of one UTC day", params=[
            *account, _param("day"), _param("limit")]),
        "/admin/usage/unit-cost": _admin("get", "Cost per million tokens of own channels, per day",
                                   params=[_param("start"), _param("end")]),
    }


def routing_paths() -> dict[str, Any]:
    """Channels and model groups at run time; a channel's fields are the config file's (api_key write-only)."""
    channel = {"type": "object", "properties": {
        "name": {"type": "string"}, "base_url": {"type": "string"}, "api_key": {"type": ["string", "null"]},
        "models": {"type": "object", "additionalProperties": {"type": "string"}}, "weight": {"type": "number"},
        "priority": {"type": "integer"}, "max_concurrency": {"type": "integer"},
        "stream_upstream": {"type": "boolean"}}}
    target = {"type": "object", "required": ["channel", "model"],
              "properties": {"channel": {"type": "string"}, "model": {"type": "string"}}}
    group = {"type": "object", "required": ["targets"], "properties": {
        "targets": {"type": "array", "items": target}, "fallbacks": {"type": "array", "items": {"type": "string"}}}}
    name = [_param("name", "path")]
    return {
        "/admin/channels": {**_admin("get", "Channels: health, draining, breakers, in-flight, settings"),
                            **_admin("post", "Add a channel", {**channel, "required": ["name", "base_url", "models"]},
                                     "201")},
        "/admin/channels/{name}": {**_admin("get", "One channel", params=name),
                                   **_admin("patch", "Change a channel's fields", channel, params=name),
                                   **_admin("delete", "Drain, then remove a channel", ok="202", params=name)},
        "/admin/model-groups": _admin("get", "Every served model name with its targets and fallbacks"),
        "/admin/model-groups/{name}": {**_admin("get", "One model group", params=name),
                                       **_admin("put", "Create or replace a model group", group, params=name),
                                       **_admin("delete", "Remove a model group", params=name)},
    }


def document(title: str, *, gateway: bool) -> dict[str, Any]:
    """The document a tier publishes; the gateway adds auth errors and the admin API."""
    paths = openai_paths(auth_errors=gateway)
    schemes: dict[str, Any] = {}
    if gateway:
        paths.update(gateway_api_paths())
        paths.update(admin_paths())
        schemes = {"api_key": {"type": "http", "scheme": "bearer", "description": "a tg-... API key"},
                   "admin": {"type": "http", "scheme": "bearer", "description": "the gateway's admin key"}}
        for route in ("/v1/chat/completions", "/v1/completions", "/v1/models", *gateway_api_paths()):
            for operation in paths[route].values():
                operation["security"] = [{"api_key": []}]
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "0.1.0"},
        "paths": paths,
        "components": {"schemas": SCHEMAS, "securitySchemes": schemes},
    }
