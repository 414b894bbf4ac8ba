"""Rendering a model's Jinja chat template the way transformers' `apply_chat_template` does."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template refused the conversation (its `raise_exception`) or failed to render it."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Jinja's own tojson escapes HTML characters, which would change the prompt the model was trained on.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class ChatTemplate:
    """A compiled chat template plus the special-token strings templates refer to (`bos_token` ...)."""

    def __init__(self, source: str, special_tokens: dict[str, str | None] | None = None) -> None:
        try:
            self._template = _compile(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
        self.source = source
        self._special = {k: v for k, v in (special_tokens or {}).items() if v is not None}

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text for `messages`; raises ChatTemplateError for conversations the template rejects."""
        if not all(isinstance(m, dict) for m in messages):
            raise ChatTemplateError("every chat message must be an object")
        # transformers drops keys whose value is None before rendering; templates test `is defined`.
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        try:
            return self._template.render(
                messages=messages,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **{**self._special, **kwargs},
            )
        except (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError) as exc:
            # Malformed messages (content not a string, missing role) surface here as Python errors.
            raise ChatTemplateError(str(exc) or type(exc).__name__) from exc
