"""The autoscaler's decision: from recent load samples, the replica count, a schedule and the time, scale up,
down or hold. Pure: no clocks, no I/O, so recorded metric series replay exactly in tests.

Up when the waiting queue per replica, or every P95 time to first token measured, stays above its target for a
whole window; down, one replica at a time, when the load stays low for a longer window; never below MIN or the
schedule's floor for the hour, never above MAX; and a cool-down after every change so a new replica can absorb
the queue before it is judged.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from config import AutoscaleSettings

SCHEDULE_ENTRY = re.compile(r"^(\d{1,2}):(\d{2})-(\d{1,2}):(\d{2})=(\d+)$")
MINUTES_PER_DAY = 24 * 60
LOW_TTFT_SHARE = 0.5  # low load: P95 TTFT at most half its target, so a drop does not push it straight over
LOW_BATCH_SHARE = 0.5  # low load: the requests running fit in one replica fewer at half a batch (rounded up)


@dataclass(slots=True, frozen=True)
class ReplicaRange:
    """`--replicas N` (fixed: MIN = MAX = N) or `--replicas MIN:MAX` (elastic)."""

    min: int
    max: int

    def __post_init__(self) -> None:
        assert 1 <= self.min <= self.max, (self.min, self.max)

    @property
    def elastic(self) -> bool:
        return self.min < self.max


@dataclass(slots=True, frozen=True)
class ScheduleWindow:
    """`HH:MM-HH:MM=N`: at least N replicas from start (inclusive) to end (exclusive), in minutes of the day;
    a window whose end is before its start runs over midnight."""

    start: int
    end: int
    replicas: int

    def covers(self, minute: int) -> bool:
        if self.start <= self.end:
            return self.start <= minute < self.end
        return minute >= self.start or minute < self.end


@dataclass(slots=True, frozen=True)
class Sample:
    """The replicas' load at one instant: requests waiting and running (summed over the serving replicas),
    and the P95 TTFT of the requests that finished since the previous sample (None when none did)."""

    at: float
    replicas: int
    waiting: float
    running: float
    ttft_p95: float | None


class Action(enum.Enum):
    UP = "up"
    DOWN = "down"
    HOLD = "hold"


@dataclass(slots=True, frozen=True)
class Decision:
    action: Action
    replicas: int  # how many replicas there should be after it
    reason: str


@dataclass(slots=True, frozen=True)
class ScalePolicy:
    """What the decision weighs samples against: the range, the schedule and the autoscale settings, plus each
    replica's batch size (its `max_num_seqs`), so a scale-down leaves room for what is running."""

    replicas: ReplicaRange
    schedule: tuple[ScheduleWindow, ...]
    settings: AutoscaleSettings
    batch_size: int

    def floor(self, minute: int) -> int:
        """MIN, or the schedule's count for this minute of the day when that is higher."""
        planned = [w.replicas for w in self.schedule if w.covers(minute)]
        return min(self.replicas.max, max([self.replicas.min, *planned]))


def parse_replicas(text: str) -> ReplicaRange:
    """`N` or `MIN:MAX`; ValueError with a message fit for the command line."""
    low, sep, high = text.partition(":")
    try:
        least, most = int(low), int(high if sep else low)
    except ValueError:
        least, most = 0, 0
    if not 1 <= least <= most:
        raise ValueError(f"{text!r}: give N or MIN:MAX with 1 <= MIN <= MAX")
    return ReplicaRange(least, most)


def parse_schedule(text: str) -> tuple[ScheduleWindow, ...]:
    """`HH:MM-HH:MM=N,...`; ValueError naming the entry that is wrong."""
    windows = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        found = SCHEDULE_ENTRY.match(entry)
        if found is None:
            raise ValueError(f"entry {entry!r}: expected HH:MM-HH:MM=N")
        h1, m1, h2, m2, count = (int(g) for g in found.groups())
        if h1 > 23 or h2 > 24 or m1 > 59 or m2 > 59 or (h2 == 24 and m2 > 0):
            raise ValueError(f"entry {entry!r}: not a time of day")
        start, end = h1 * 60 + m1, (h2 * 60 + m2) % MINUTES_PER_DAY
        if start == end:
            raise ValueError(f"entry {entry!r}: the window is empty")
        windows.append(ScheduleWindow(start, end, count))
    if not windows:
        raise ValueError("no entries; expected HH:MM-HH:MM=N,...")
    return tuple(windows)


def schedule_problem(replicas: ReplicaRange, schedule: Sequence[ScheduleWindow]) -> str | None:
    if not replicas.elastic:
        return "--schedule needs --replicas MIN:MAX"
    above = [w.replicas for w in schedule if w.replicas > replicas.max]
    if above:
        return f"--schedule asks for {max(above)} replicas, above MAX {replicas.max}"
    return None


def decide(samples: Sequence[Sample], replicas: int, policy: ScalePolicy, now: float, minute: int,
           last_change: float) -> Decision:
    """What to do now with `replicas` serving, given the samples (oldest first) and when the last change ended.

    Only samples taken since the last change count: the load seen with another replica count says little
    about this one. A window counts as sustained only once samples cover all of it.
    """
    floor, ceiling = policy.floor(minute), policy.replicas.max
    if replicas < floor:
        return Decision(Action.UP, floor, f"below the floor of {floor} (MIN or schedule)")
    if replicas > ceiling:
        return Decision(Action.DOWN, ceiling, f"above MAX {ceiling}")
    settings = policy.settings
    if now - last_change < settings.cooldown:
        return Decision(Action.HOLD, replicas, "cooling down")
    recent = [s for s in samples if s.at >= last_change and s.replicas == replicas]
    watched = _window(recent, now, settings.scale_up_window)
    if replicas < ceiling and watched and (reason := _too_high(watched, settings)):
        return Decision(Action.UP, replicas + 1, f"{reason} for {settings.scale_up_window:g}s")
    watched = _window(recent, now, settings.scale_down_window)
    if replicas > floor and watched and _low(watched, policy):
        return Decision(Action.DOWN, replicas - 1, f"low load for {settings.scale_down_window:g}s")
    return Decision(Action.HOLD, replicas, "within targets")


def _window(samples: Sequence[Sample], now: float, window: float) -> list[Sample]:
    """The samples of the last `window` seconds; none until the samples reach back that far."""
    if not samples or samples[0].at > now - window:
        return []
    return [s for s in samples if s.at >= now - window]


def _ttfts(samples: Sequence[Sample]) -> list[float]:
    """The P95 TTFTs measured; a read in which no request finished says nothing about the TTFT either way."""
    return [s.ttft_p95 for s in samples if s.ttft_p95 is not None]


def _too_high(samples: Sequence[Sample], settings: AutoscaleSettings) -> str:
    """Why the load stayed too high through these samples, or '' when it did not."""
    waiting = min(s.waiting / max(s.replicas, 1) for s in samples)
    if waiting > settings.target_waiting:
        return f"waiting {waiting:g} per replica > {settings.target_waiting:g}"
    ttfts = _ttfts(samples)
    if ttfts and min(ttfts) > settings.target_ttft_p95:
        return f"P95 TTFT {min(ttfts):.2f}s > {settings.target_ttft_p95:g}s"
    return ""


def _low(samples: Sequence[Sample], policy: ScalePolicy) -> bool:
    room = math.ceil((samples[0].replicas - 1) * policy.batch_size * LOW_BATCH_SHARE)
    ttft_limit = policy.settings.target_ttft_p95 * LOW_TTFT_SHARE
    return (all(s.waiting == 0 and s.running <= room for s in samples)
            and all(t <= ttft_limit for t in _ttfts(samples)))
