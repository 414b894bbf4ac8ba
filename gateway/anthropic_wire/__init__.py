"""Anthropic's Messages API <-> OpenAI chat completions, as pure functions over parsed JSON.

Used in both directions: `/v1/messages` in (a Messages client served by chat channels), and `kind: anthropic`
channels out (chat requests served by an Anthropic upstream).
"""

from __future__ import annotations

from gateway.anthropic_wire.answer import chat_answer, chat_error, messages_answer, messages_error
from gateway.anthropic_wire.events import ChatChunks, Event, MessagesEvents
from gateway.anthropic_wire.request import chat_request, messages_request

__all__ = ["ChatChunks", "Event", "MessagesEvents", "chat_answer", "chat_error", "chat_request",
           "messages_answer", "messages_error", "messages_request"]
