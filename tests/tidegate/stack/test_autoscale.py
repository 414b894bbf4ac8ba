"""The autoscaler's decision over metric series: table rows of samples (one a second) with the replicas serving,
the time of day and the decision the series must produce; and a series recorded from a real stack, replayed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from config import AutoscaleSettings
from tidegate.stack.autoscale import (
    Action,
    ReplicaRange,
    Sample,
    ScalePolicy,
    ScheduleWindow,
    decide,
    parse_replicas,
    parse_schedule,
    schedule_problem,
)

SETTINGS = AutoscaleSettings(scale_up_window=5, scale_down_window=10, cooldown=3, target_waiting=2,
                             target_ttft_p95=1.0)
NOON = 12 * 60
ONE_TO_THREE = ReplicaRange(1, 3)


def series(replicas: int, *rows: tuple[float, float, float | None]) -> list[Sample]:
    """Samples at t = 0, 1, 2, ... from (waiting, running, ttft_p95) rows."""
    return [Sample(float(t), replicas, w, r, p) for t, (w, r, p) in enumerate(rows)]


def steady(replicas: int, seconds: int, waiting: float, running: float, ttft: float | None) -> list[Sample]:
    return series(replicas, *[(waiting, running, ttft)] * seconds)


# a queue building up on one replica after a load step at t = 3 (waiting and running summed over replicas)
LOAD_STEP = series(1, (0, 1, 0.2), (0, 1, 0.3), (0, 2, None), (3, 4, 0.9), (5, 4, 1.4), (6, 4, 1.8),
                   (6, 4, 2.2), (7, 4, 2.5), (8, 4, 2.9), (8, 4, 3.1))
# a burst that clears before the window is over
SHORT_BURST = series(1, (0, 1, 0.2), (6, 4, 0.4), (7, 4, 0.6), (5, 4, 0.8), (0, 3, 0.9), (0, 1, 0.5),
                     (0, 1, 0.3), (0, 1, 0.2))
# after the peak on two replicas: the queue gone, the last requests finishing, then nothing
AFTER_PEAK = series(2, (1, 8, 0.9), (0, 6, 0.6), (0, 2, 0.3), *[(0, 0, None)] * 11)

# long requests: few finish between two reads, so most reads carry no TTFT
SPARSE_SLOW = series(1, (0, 4, 1.5), (0, 4, None), (0, 4, None), (0, 4, 1.7), (0, 4, None), (0, 4, None),
                     (0, 4, 2.1), (0, 4, None))
SPARSE_MIXED = series(1, (0, 4, 1.5), (0, 4, None), (0, 4, None), (0, 4, 1.7), (0, 4, None), (0, 4, None),
                      (0, 4, 2.1), (0, 4, 0.8))


@dataclass(slots=True, frozen=True)
class Case:
    name: str
    samples: list[Sample]
    replicas: int
    expected: Action
    to: int
    range: ReplicaRange = ONE_TO_THREE
    schedule: tuple[ScheduleWindow, ...] = ()
    minute: int = NOON
    last_change: float = -100.0

    def decide(self) -> tuple[Action, int, str]:
        policy = ScalePolicy(self.range, self.schedule, SETTINGS, batch_size=4)
        now = self.samples[-1].at if self.samples else 0.0
        decision = decide(self.samples, self.replicas, policy, now, self.minute, self.last_change)
        return decision.action, decision.replicas, decision.reason


CASES = [
    Case("a queue that stays above target for the window adds one replica", LOAD_STEP, 1, Action.UP, 2),
    Case("a queue that began less than a window ago holds", LOAD_STEP[:7], 1, Action.HOLD, 1),
    Case("a burst shorter than the window holds", SHORT_BURST, 1, Action.HOLD, 1),
    Case("P95 TTFT above target with an empty queue adds one", steady(1, 7, 0, 4, 1.6), 1, Action.UP, 2),
    Case("TTFT without finished requests is no signal", steady(1, 7, 0, 4, None), 1, Action.HOLD, 1),
    Case("sparse TTFT readings, each above target, add one", SPARSE_SLOW, 1, Action.UP, 2),
    Case("one TTFT reading under target in the window holds", SPARSE_MIXED, 1, Action.HOLD, 1),
    Case("never above MAX", steady(3, 8, 20, 12, 4.0), 3, Action.HOLD, 3),
    Case("within the cool-down after a change it holds", steady(1, 8, 9, 4, 3.0), 1, Action.HOLD, 1,
         last_change=5.0),
    Case("samples from before the last change do not count", steady(1, 8, 9, 4, 3.0), 1, Action.HOLD, 1,
         last_change=3.0),
    Case("samples taken with another replica count do not count", steady(2, 8, 9, 4, 3.0), 1, Action.HOLD, 1),
    Case("low load for the down window drains one", AFTER_PEAK, 2, Action.DOWN, 1),
    Case("low load for less than the down window holds", AFTER_PEAK[:10], 2, Action.HOLD, 2),
    Case("no queue but a batch that would not fit one replica fewer holds", steady(2, 12, 0, 3, 0.3), 2,
         Action.HOLD, 2),
    Case("never below MIN", steady(2, 12, 0, 0, None), 2, Action.HOLD, 2, range=ReplicaRange(2, 3)),
    Case("the schedule's floor for the hour holds replicas up", steady(2, 12, 0, 0, None), 2, Action.HOLD, 2,
         schedule=(ScheduleWindow(8 * 60, 20 * 60, 2),)),
    Case("outside the schedule's hours the floor is MIN", steady(2, 12, 0, 0, None), 2, Action.DOWN, 1,
         schedule=(ScheduleWindow(8 * 60, 20 * 60, 2),), minute=21 * 60),
    Case("a window over midnight applies after midnight", steady(1, 2, 0, 0, None), 1, Action.UP, 3,
         schedule=(ScheduleWindow(22 * 60, 6 * 60, 3),), minute=60),
    Case("rising to the schedule's floor ignores the cool-down and the window", [], 1, Action.UP, 2,
         schedule=(ScheduleWindow(8 * 60, 20 * 60, 2),), last_change=0.0),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decision_over_recorded_series(case: Case) -> None:
    action, to, reason = case.decide()
    assert (action, to) == (case.expected, case.to), reason


def test_a_scale_up_names_what_was_over_its_target() -> None:
    assert Case("", LOAD_STEP, 1, Action.UP, 2).decide()[2] == "waiting 5 per replica > 2 for 5s"
    assert Case("", steady(1, 7, 0, 4, 1.6), 1, Action.UP, 2).decide()[2] == "P95 TTFT 1.60s > 1s for 5s"


@pytest.mark.parametrize(("text", "expected"), [("1", ReplicaRange(1, 1)), ("2:4", ReplicaRange(2, 4)),
                                                ("3:3", ReplicaRange(3, 3))])
def test_replicas_parse_a_count_or_a_range(text: str, expected: ReplicaRange) -> None:
    assert parse_replicas(text) == expected


@pytest.mark.parametrize("text", ["0", "0:2", "3:1", "a:b", "1:", ":2", "-1:2", "1:2:3"])
def test_bad_replicas_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="MIN:MAX"):
        parse_replicas(text)


def test_a_schedule_parses_several_windows() -> None:
    assert parse_schedule("08:00-20:00=3, 22:30-24:00=2") == (
        ScheduleWindow(480, 1200, 3), ScheduleWindow(1350, 0, 2))


@pytest.mark.parametrize("text", ["", "8-20=3", "08:00-20:00", "25:00-02:00=1", "08:61-09:00=1",
                                  "08:00-08:00=2", "08:00-20:00=x"])
def test_bad_schedules_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_schedule(text)


def test_a_schedule_needs_a_range_that_holds_it() -> None:
    windows = parse_schedule("08:00-20:00=3")
    assert schedule_problem(ReplicaRange(2, 2), windows) == "--schedule needs --replicas MIN:MAX"
    assert schedule_problem(ReplicaRange(1, 2), windows) == "--schedule asks for 3 replicas, above MAX 2"
    assert schedule_problem(ReplicaRange(1, 3), windows) is None


RECORDED = json.loads((Path(__file__).parent / "data" / "load_step_1_to_2.json").read_text())
E2E_SETTINGS = AutoscaleSettings(metrics_interval=0.5, scale_up_window=2, scale_down_window=4, cooldown=1,
                                 target_waiting=1, target_ttft_p95=60)


def replay(settings: AutoscaleSettings) -> list[tuple[Sample, Action]]:
    """The decision at each recorded read, as the driver takes it: with the replicas read then, and the last change
    when backend-2 began serving."""
    samples = [Sample(*row) for row in RECORDED["samples"]]
    serving = RECORDED["events"]["backend-2 serving"]
    policy = ScalePolicy(ReplicaRange(1, 2), (), settings, batch_size=1)
    return [(s, decide(samples[:i + 1], s.replicas, policy, s.at, NOON, serving if s.replicas == 2 else 0.0).action)
            for i, s in enumerate(samples)]


def test_the_recorded_load_step_scales_up_one_window_after_the_queue_formed() -> None:
    decisions = replay(E2E_SETTINGS)
    queued = next(s.at for s, _ in decisions if s.waiting > 1)
    first_up = next(s.at for s, action in decisions if action is Action.UP)
    assert queued + 2 - 0.75 <= first_up <= queued + 2 + 1.0  # one window, give or take one read
    assert all(action is Action.HOLD for s, action in decisions if s.at < first_up)


def test_a_ttft_target_alone_scales_the_recorded_step_once_every_reading_in_the_window_is_over_it() -> None:
    decisions = replay(E2E_SETTINGS.model_copy(update={"target_waiting": 10, "target_ttft_p95": 5,
                                                       "scale_up_window": 5}))
    first_up = next(s.at for s, action in decisions if action is Action.UP)
    last_fast = max(s.at for s, _ in decisions if s.ttft_p95 is not None and s.ttft_p95 <= 5 and s.at < first_up)
    assert last_fast + 5 <= first_up <= last_fast + 5 + 1.5


def test_the_recorded_peak_on_two_replicas_is_never_scaled_down_while_a_request_waits() -> None:
    decisions = replay(E2E_SETTINGS)
    on_two = [(s, action) for s, action in decisions if s.replicas == 2]
    assert on_two and all(action is not Action.UP for _, action in on_two)  # MAX
    for sample, action in on_two:
        if action is Action.DOWN:
            assert all(s.waiting == 0 for s, _ in on_two if sample.at - 4 <= s.at <= sample.at)
