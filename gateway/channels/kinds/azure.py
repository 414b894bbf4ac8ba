"""`kind: azure`: Azure OpenAI, which speaks OpenAI's bodies at a deployment's path with an `api-key` header.

The upstream model name is the deployment's name; `base_url` is the resource's root
(`https://NAME.openai.azure.com`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from config import Channel
from gateway.channels.kinds.kind import WireCall
from gateway.channels.kinds.openai import OpenAIKind


class AzureKind(OpenAIKind):
    def call(self, channel: Channel, path: str, body: dict[str, Any]) -> WireCall:
        deployment = quote(str(body["model"]), safe="")
        url = f"{channel.base_url.rstrip('/')}/openai/deployments/{deployment}{path}?api-version={channel.api_version}"
        headers = {"api-key": channel.api_key} if channel.api_key else {}
        return WireCall(url, headers, body)
