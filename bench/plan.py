"""Capacity planning from a concurrency sweep: the most goodput one instance delivers within the SLO, and
how many instances a peak needs with headroom."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


class PlanError(ValueError):
    """The sweep cannot support a plan (no SLO figures, or no level meets the SLO)."""


@dataclass(slots=True)
class CapacityPlan:
    """Per-instance capacity at the SLO and the instance count for `peak_qps` x `headroom`."""

    slo: str
    attainment_target: float  # share of requests that must meet the SLO at a usable level
    peak_qps: float
    headroom: float
    concurrency: int  # the chosen sweep level
    capacity_qps: float  # goodput at that level: requests per second that met the SLO
    attainment: float
    throughput_qps: float
    mean_e2el_s: float
    instances: int
    best_is_last_level: bool  # capacity may lie beyond the sweep

    def __post_init__(self) -> None:
        assert self.capacity_qps > 0 and self.instances >= 1

    @property
    def required_qps(self) -> float:
        return self.peak_qps * self.headroom

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"required_qps": self.required_qps}

    def describe(self) -> str:
        """The plan with its arithmetic and Little's law (L = lambda x W) spelled out."""
        in_flight_level = self.throughput_qps * self.mean_e2el_s
        in_flight_peak = self.peak_qps * self.mean_e2el_s
        lines = [
            f"Capacity plan: SLO {self.slo} met by >= {self.attainment_target:.0%} of requests",
            f"  per instance: concurrency {self.concurrency} gives {self.capacity_qps:.3f} req/s within SLO "
            f"({self.attainment:.1%} of requests, {self.throughput_qps:.3f} req/s in all)",
            f"  required: peak {self.peak_qps:g} req/s x headroom {self.headroom:g} = {self.required_qps:g} req/s",
            f"  instances = ceil({self.required_qps:g} / {self.capacity_qps:.3f}) = {self.instances}",
            f"  Little's law L = lambda x W: at that level {self.throughput_qps:.3f} req/s x "
            f"{self.mean_e2el_s:.3f} s mean E2EL = {in_flight_level:.1f} requests in flight "
            f"(swept at {self.concurrency})",
            f"  at peak: {self.peak_qps:g} req/s x {self.mean_e2el_s:.3f} s = {in_flight_peak:.1f} in flight "
            f"across the fleet, {in_flight_peak / self.instances:.1f} per instance",
        ]
        if self.best_is_last_level:
            lines.append("  note: the largest swept level still meets the SLO; sweep higher to find the limit")
        return "\n".join(lines)


def plan_capacity(summaries: Sequence[dict[str, Any]], peak_qps: float, headroom: float = 1.0,
                  attainment: float = 0.95) -> CapacityPlan:
    """Pick the sweep level with the most goodput among those where `attainment` of requests met the SLO."""
    if not peak_qps > 0 or not headroom >= 1.0 or not 0 < attainment <= 1:
        raise PlanError("--peak-qps must be positive, --headroom at least 1, --slo-attainment in (0, 1]")
    if not summaries or any("request_goodput" not in s for s in summaries):
        raise PlanError("the sweep carries no goodput: run it (or re-read it with --save-requests data) with --slo")
    levels = sorted(summaries, key=lambda s: s["max_concurrency"] or 0)
    usable = [s for s in levels if s["slo_attainment"] >= attainment and s["request_goodput"] > 0]
    if not usable:
        best = max(s["slo_attainment"] for s in levels)
        raise PlanError(f"no swept level meets the SLO for {attainment:.0%} of requests "
                        f"(best {best:.1%}); relax the SLO or sweep lower concurrency")
    chosen = max(usable, key=lambda s: s["request_goodput"])
    capacity = float(chosen["request_goodput"])
    return CapacityPlan(
        slo=str(chosen.get("slo", "")), attainment_target=attainment, peak_qps=peak_qps, headroom=headroom,
        concurrency=int(chosen["max_concurrency"]), capacity_qps=capacity,
        attainment=float(chosen["slo_attainment"]), throughput_qps=float(chosen["request_throughput"]),
        mean_e2el_s=float(chosen["mean_e2el_ms"]) / 1e3,
        # a hair of tolerance so that 52 / 2.6 does not become 21 through float rounding
        instances=max(1, math.ceil(peak_qps * headroom / capacity - 1e-9)),
        best_is_last_level=chosen is levels[-1],
    )
