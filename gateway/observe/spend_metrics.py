"""Prometheus spend counters: the settled cost by account and model, in the configured currency."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from gateway.records import Usage
from quota import MICRO, Reservation, settled_cost


class SpendMetrics:
    """Labels stay bounded as in GatewayMetrics: accounts (or `all` when per-account series are off) and the
    models the gateway serves (`other` for any other name)."""

    def __init__(self, registry: CollectorRegistry, model_label: Callable[[str | None], str], per_account: bool):
        self._model_label = model_label
        self._per_account = per_account
        self.spend = Counter("tidegate_spend", "Settled cost in the gateway's currency, by account and model",
                             ["account", "model"], registry=registry)

    def settled(self, reservation: Reservation, usage: Usage, channel: str | None) -> None:
        cost = settled_cost(reservation, prompt_tokens=usage.prompt_tokens, cached_tokens=usage.cached_tokens,
                            completion_tokens=usage.completion_tokens, channel=channel)
        if cost:
            account = reservation.account_id if self._per_account else "all"
            self.spend.labels(account, self._model_label(reservation.model)).inc(cost / MICRO)
