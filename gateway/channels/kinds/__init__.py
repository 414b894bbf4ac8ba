"""Channel kinds: how a chat request is put on an upstream's wire, and how its answer is read back as OpenAI chat.

One module per kind behind `ChannelKind`; the rest of the gateway (usage, relay, first-token timing) only ever
sees OpenAI bodies and chunks.
"""

from __future__ import annotations

from config import Channel
from gateway.channels.kinds.anthropic import AnthropicKind
from gateway.channels.kinds.azure import AzureKind
from gateway.channels.kinds.kind import ChannelKind, WireCall
from gateway.channels.kinds.openai import OpenAIKind

__all__ = ["ChannelKind", "WireCall", "kind_of"]

KINDS: dict[str, ChannelKind] = {"openai": OpenAIKind(), "azure": AzureKind(), "anthropic": AnthropicKind()}


def kind_of(channel: Channel) -> ChannelKind:
    return KINDS[channel.kind]
