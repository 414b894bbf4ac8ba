"""Aggregate request records into vLLM's benchmark metrics (same names, same formulas).

TTFT, TPOT = (E2EL - TTFT) / (output tokens - 1), ITL (every gap between text chunks) and E2EL, each as
mean, median, std, P95 and P99 in milliseconds; request, output and total token throughput over the run's
duration (completed requests only); output tokens per completed request (mean, median, P95: with answers
ending at EOS, what was actually generated); goodput as the rate of requests meeting every SLO; failures
counted by status.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.records import MeasuredRequest

METRICS = ("ttft", "tpot", "itl", "e2el")
# name in the JSON -> percentile passed to numpy (linear interpolation, as vLLM does)
PERCENTILES = (("p95", 95.0), ("p99", 99.0))


class SloError(ValueError):
    """An --slo string that cannot be parsed."""


@dataclass(frozen=True, slots=True)
class Slo:
    """Per-request latency objectives in milliseconds; a request is good when it meets all that are set."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise SloError(f"SLO {name} must be positive, got {value}")

    @classmethod
    def parse(cls, text: str) -> Slo:
        """Parse `ttft:MS,tpot:MS,e2el:MS` (any subset, any order)."""
        values: dict[str, float] = {}
        for part in text.split(","):
            name, sep, number = part.strip().partition(":")
            if not sep or name not in ("ttft", "tpot", "e2el"):
                raise SloError(f"bad SLO {part!r}: expected ttft:MS, tpot:MS or e2el:MS")
            if name in values:
                raise SloError(f"SLO {name} given twice")
            try:
                values[name] = float(number)
            except ValueError:
                raise SloError(f"bad SLO {part!r}: {number!r} is not a number of milliseconds") from None
        return cls(**{f"{name}_ms": value for name, value in values.items()})

    def met_by(self, record: MeasuredRequest) -> bool:
        if not record.ok:
            return False
        tpot = record.tpot
        return (
            (self.ttft_ms is None or record.ttft * 1e3 <= self.ttft_ms)
            and (self.tpot_ms is None or tpot is None or tpot * 1e3 <= self.tpot_ms)
            and (self.e2el_ms is None or record.e2el * 1e3 <= self.e2el_ms)
        )

    def describe(self) -> str:
        parts = [f"{name}:{getattr(self, f'{name}_ms'):g}" for name in ("ttft", "tpot", "e2el")
                 if getattr(self, f"{name}_ms") is not None]
        return ",".join(parts)


def distribution(name: str, values_s: Sequence[float]) -> dict[str, float]:
    """mean/median/std/p95/p99 of `values_s` (seconds) as `<stat>_<name>_ms`; zeros when empty, like vLLM."""
    ms = np.asarray(values_s, dtype=float) * 1e3
    if ms.size == 0:
        ms = np.zeros(1)
    out = {
        f"mean_{name}_ms": float(ms.mean()),
        f"median_{name}_ms": float(np.median(ms)),
        f"std_{name}_ms": float(ms.std()),
    }
    for label, q in PERCENTILES:
        out[f"{label}_{name}_ms"] = float(np.percentile(ms, q))
    return out


def summarize(records: Sequence[MeasuredRequest], duration: float, slo: Slo | None = None) -> dict[str, Any]:
    """The run's figures under vLLM's key names; `duration` runs from the start of the run to the end of its
    last request, completed or failed, and only completed requests count toward throughput."""
    done = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    total_in = sum(r.input_tokens for r in done)
    total_out = sum(r.output_tokens for r in done)
    total_cached = sum(r.cached_tokens for r in done)
    per = max(duration, 1e-9)
    out: dict[str, Any] = {
        "duration": duration,
        "completed": len(done),
        "failed": len(failed),
        "errors": dict(sorted(Counter(r.error or "no_tokens" for r in failed).items())),
        "retried_on_fresh_connection": sum(r.retried for r in records),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "total_cached_tokens": total_cached,
        "cached_prompt_share": total_cached / total_in if total_in else 0.0,  # from the servers' usage
        "request_throughput": len(done) / per,
        "output_throughput": total_out / per,
        "total_token_throughput": (total_in + total_out) / per,
    }
    lengths = np.asarray([r.output_tokens for r in done] or [0], dtype=float)
    out.update({"mean_output_len": float(lengths.mean()), "median_output_len": float(np.median(lengths)),
                "p95_output_len": float(np.percentile(lengths, 95.0))})
    if slo is not None:
        good = sum(1 for r in done if slo.met_by(r))
        out["slo"] = slo.describe()
        out["request_goodput"] = good / per
        # failures count against attainment: a request that errored did not meet the SLO
        out["slo_attainment"] = good / len(records) if records else 0.0
    samples: dict[str, list[float]] = {
        "ttft": [r.ttft for r in done],
        "tpot": [t for r in done if (t := r.tpot) is not None],
        "itl": [gap for r in done for gap in r.itl],
        "e2el": [r.e2el for r in done],
    }
    for name in METRICS:
        out.update(distribution(name, samples[name]))
    queue = [q for r in records if (q := r.client_queue) is not None]
    out.update({k: v for k, v in distribution("client_queue", queue).items() if not k.startswith("std_")})
    out["usage_reported"] = all(r.usage_reported for r in done)
    return out
