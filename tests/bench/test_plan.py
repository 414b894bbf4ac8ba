"""Capacity plan arithmetic: the level chosen by goodput, ceil(peak x headroom / capacity), Little's law."""

from __future__ import annotations

from typing import Any

import pytest

from bench.plan import PlanError, plan_capacity


def level(concurrency: int, goodput: float, attainment: float, throughput: float | None = None,
          mean_e2el_ms: float = 2000.0) -> dict[str, Any]:
    return {"max_concurrency": concurrency, "request_goodput": goodput, "slo_attainment": attainment,
            "request_throughput": throughput if throughput is not None else goodput / max(attainment, 1e-9),
            "mean_e2el_ms": mean_e2el_ms, "slo": "ttft:500,tpot:50"}


SWEEP = [level(1, 0.5, 1.0), level(2, 1.0, 1.0), level(4, 1.9, 0.99), level(8, 2.6, 0.96),
         level(16, 1.5, 0.40), level(32, 0.2, 0.05)]


def test_plan_takes_the_most_goodput_among_levels_that_meet_the_slo() -> None:
    plan = plan_capacity(SWEEP, peak_qps=40.0, headroom=1.3)
    assert plan.concurrency == 8
    assert plan.capacity_qps == 2.6
    assert plan.required_qps == pytest.approx(52.0)
    assert plan.instances == 20  # 52 / 2.6 is exactly 20, float rounding must not make it 21
    assert not plan.best_is_last_level


def test_instances_round_up() -> None:
    assert plan_capacity(SWEEP, peak_qps=10.0, headroom=1.0).instances == 4  # 10 / 2.6 = 3.85


def test_stricter_attainment_picks_a_lower_level() -> None:
    plan = plan_capacity(SWEEP, peak_qps=10.0, attainment=0.99)
    assert (plan.concurrency, plan.instances) == (4, 6)  # ceil(10 / 1.9)


def test_unsorted_sweep_is_read_by_concurrency() -> None:
    assert plan_capacity(list(reversed(SWEEP)), peak_qps=40.0, headroom=1.3).concurrency == 8


def test_plan_spells_out_littles_law() -> None:
    plan = plan_capacity([level(4, 2.0, 1.0, throughput=2.0, mean_e2el_ms=1900.0)], peak_qps=10.0)
    text = plan.describe()
    assert "instances = ceil(10 / 2.000) = 5" in text
    assert "2.000 req/s x 1.900 s mean E2EL = 3.8 requests in flight" in text
    assert "10 req/s x 1.900 s = 19.0 in flight across the fleet, 3.8 per instance" in text
    assert "sweep higher" in text  # the only level is the last level
    assert plan.to_dict()["required_qps"] == 10.0


def test_no_level_meeting_the_slo_is_an_error_with_the_best_attainment() -> None:
    with pytest.raises(PlanError, match=r"best 40\.0%"):
        plan_capacity([level(16, 1.5, 0.40), level(32, 0.2, 0.05)], peak_qps=10.0)


def test_a_sweep_without_slo_figures_cannot_be_planned() -> None:
    bare = {"max_concurrency": 1, "request_throughput": 1.0, "mean_e2el_ms": 10.0}
    with pytest.raises(PlanError, match="goodput"):
        plan_capacity([bare], peak_qps=1.0)


@pytest.mark.parametrize("kwargs", [{"peak_qps": 0.0}, {"peak_qps": 5.0, "headroom": 0.9},
                                    {"peak_qps": 5.0, "attainment": 0.0}, {"peak_qps": 5.0, "attainment": 1.5}])
def test_nonsense_plan_inputs_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(PlanError):
        plan_capacity(SWEEP, **kwargs)
