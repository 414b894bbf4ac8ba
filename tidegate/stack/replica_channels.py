"""The gateway channels that `tidegate up` owns, one per backend replica, kept through the admin API at run time.

A replica is registered once it is healthy and drained (DELETE) before it is stopped: the gateway sends a
draining channel no new request and removes it once its requests in flight have finished.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import httpx

REPLICA_PREFIX = "backend-"  # the channels `tidegate up` owns in the store


class ReplicaChannels:
    def __init__(self, gateway_url: str, admin_key: str, served_model: str, backend_token: str | None = None):
        self._url = gateway_url
        self._admin = {"Authorization": f"Bearer {admin_key}"}
        self._served = served_model
        self._token = backend_token  # the replicas' gateway token, sent as each channel's api_key

    def register(self, name: str, replica_url: str) -> None:
        """Adds the channel, or points an existing one at this replica (the store keeps channels across runs)."""
        fields = {"base_url": f"{replica_url}/v1", "models": [self._served], "api_key": self._token}
        created = httpx.post(f"{self._url}/admin/channels", headers=self._admin, json={"name": name, **fields},
                             timeout=10)
        if created.status_code == 409:
            httpx.patch(f"{self._url}/admin/channels/{name}", headers=self._admin, json=fields, timeout=10
                        ).raise_for_status()
        else:
            created.raise_for_status()

    def drain(self, name: str) -> None:
        gone = httpx.delete(f"{self._url}/admin/channels/{name}", headers=self._admin, timeout=10)
        if gone.status_code != 404:  # one already removed is as drained as it gets
            gone.raise_for_status()

    def drained(self, name: str) -> bool:
        """Whether the gateway has removed the channel, which it does once no request of it is in flight."""
        return httpx.get(f"{self._url}/admin/channels/{name}", headers=self._admin, timeout=10).status_code == 404

    def drain_all_but(self, names: Iterable[str]) -> None:
        """Drains the replica channels of earlier runs that this run does not have, so none is routed to."""
        keep = set(names)
        listed = httpx.get(f"{self._url}/admin/channels", headers=self._admin, timeout=10).json()["data"]
        for row in listed:
            if row["name"].startswith(REPLICA_PREFIX) and row["name"] not in keep:
                with contextlib.suppress(httpx.HTTPStatusError):  # a stale channel must not stop the start
                    self.drain(row["name"])
