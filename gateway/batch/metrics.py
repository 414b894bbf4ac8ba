"""What the dispatcher shows on `/metrics`: lines ended by outcome, lines in flight, and how many it allows now
(the number that halves while realtime traffic is pressed)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

OUTCOMES = ("answered", "failed", "retried")


class BatchMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.lines = Counter("tidegate_batch_lines", "Batch lines run by this replica, by outcome: answered (output "
                             "file), failed (error file) or retried (refused for now, run again later)",
                             ["outcome"], registry=registry)
        self.in_flight = Gauge("tidegate_batch_lines_in_flight", "Batch lines this replica runs now",
                               registry=registry)
        self.allowed = Gauge("tidegate_batch_lines_allowed", "Batch lines the dispatcher allows in flight now",
                             registry=registry)
        for outcome in OUTCOMES:
            self.lines.labels(outcome)
