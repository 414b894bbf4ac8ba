"""Admin routes for channels and model groups at run time; a channel's api_key is write-only."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request

from config import Channel, ModelGroup
from config.model_groups import group_problem
from gateway.admin.keyed_records import key_hidden, named, refuse_rename, updated_record, validated_record
from gateway.channels.registry import ChannelRegistry, channel_record
from gateway.channels.state import ChannelState
from gateway.errors import ApiError, invalid_request, not_found

Handler = Callable[[Request], Awaitable[Any]]
ReadJson = Callable[[Request], Awaitable[dict[str, Any]]]
# a name must fit in a URL path segment as it is
NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def channel_handlers(registry: ChannelRegistry, read_json: ReadJson) -> dict[str, Handler]:
    """The handlers by their action in the admin route table (gateway.admin.access.RULES)."""
    api = ChannelAdmin(registry, read_json)
    return {"channels.list": api.list_channels, "channels.create": api.add_channel,
            "channels.read": api.get_channel, "channels.update": api.update_channel,
            "channels.remove": api.remove_channel, "model-groups.list": api.list_groups,
            "model-groups.read": api.get_group, "model-groups.set": api.put_group,
            "model-groups.remove": api.delete_group}


def channel_view(state: ChannelState) -> dict[str, Any]:
    """Live status and settings; whether an api_key is set, never the key."""
    settings = key_hidden(state.config, "name", "base_url")
    return {**state.status(), "settings": settings, "api_key_set": settings.pop("api_key_set")}


class ChannelAdmin:
    def __init__(self, registry: ChannelRegistry, read_json: ReadJson):
        self._registry = registry
        self._read_json = read_json

    def _channel(self, request: Request) -> ChannelState:
        return named(self._registry.channels, request, "channel", "channel_not_found")

    async def list_channels(self, request: Request) -> Any:
        return {"data": [channel_view(c) for c in self._registry.channels.values()]}

    async def get_channel(self, request: Request) -> Any:
        return channel_view(self._channel(request))

    async def add_channel(self, request: Request) -> Any:
        config = validated_record(Channel, await self._read_json(request))
        if not NAME.match(config.name):
            raise invalid_request("name: letters, digits, '.', '_' and '-' only, at most 64", "name")
        if config.name in self._registry.channels:
            raise ApiError(409, f"channel {config.name!r} exists; PATCH it instead", "invalid_request_error",
                           "channel_exists", "name")
        return 201, channel_view(await self._registry.put_channel(config))

    async def update_channel(self, request: Request) -> Any:
        state = self._channel(request)
        changes = await self._read_json(request)
        refuse_rename(changes, state.name, "a channel")
        if state.draining:
            raise ApiError(409, f"channel {state.name!r} is draining", "invalid_request_error", "channel_draining")
        config = updated_record(Channel, channel_record(state.config), changes, "base_url")
        return channel_view(await self._registry.put_channel(config))

    async def remove_channel(self, request: Request) -> Any:
        state = self._channel(request)
        return 202, channel_view(await self._registry.drain_channel(state.name))

    async def list_groups(self, request: Request) -> Any:
        return {"data": [self._group_view(name) for name in sorted(self._served())]}

    async def get_group(self, request: Request) -> Any:
        name = request.path_params["name"]
        if name not in self._served():
            raise not_found(f"the model {name!r} does not exist", "model_not_found")
        return self._group_view(name)

    async def put_group(self, request: Request) -> Any:
        name = request.path_params["name"]
        if not NAME.match(name):
            raise invalid_request("a model name: letters, digits, '.', '_' and '-' only, at most 64")
        group = validated_record(ModelGroup, await self._read_json(request))
        others = {n: g for n, g in self._registry.groups.items() if n != name}
        problem = group_problem(name, group, others, self._registry.channels, self._implicit())
        if problem is not None:
            raise invalid_request(problem)
        await self._registry.put_group(name, group)
        return self._group_view(name)

    async def delete_group(self, request: Request) -> Any:
        name = request.path_params["name"]
        groups = self._registry.groups
        if name not in groups:
            raise not_found(f"no model group {name!r} (a channel's models map is changed on the channel)",
                            "model_group_not_found")
        users = sorted(n for n, g in groups.items() if name in g.fallbacks)
        if users and name not in self._implicit():
            raise invalid_request(f"{', '.join(users)} fall back to {name!r}: change them first")
        await self._registry.delete_group(name)
        return {"name": name, "deleted": True}

    def _implicit(self) -> set[str]:
        return {m for c in self._registry.channels.values() for m in c.config.models}

    def _served(self) -> set[str]:
        return self._implicit() | set(self._registry.groups)

    def _group_view(self, name: str) -> dict[str, Any]:
        group = self._registry.groups.get(name)
        if group is not None:
            return {"name": name, **group.model_dump(mode="json"), "implicit": False}
        targets = [{"channel": c.name, "model": c.config.models[name]} for c in self._registry.channels.values()
                   if name in c.config.models]
        return {"name": name, "targets": targets, "fallbacks": [], "implicit": True}

