"""Results out: JSON round-trips, CSV rows, the console table's warnings, and the sweep PNG."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bench.loadgen import LoadProfile, RunResult
from bench.metrics import Slo
from bench.records import MeasuredRequest as RequestRecord
from bench.report import format_summary, format_sweep, plot_sweep, read_summaries, write_csv, write_json


def finished(index: int, scheduled: float, ttft: float) -> RequestRecord:
    times = [scheduled + ttft + 0.02 * i for i in range(8)]
    return RequestRecord(index=index, scheduled=scheduled, sent=scheduled + 0.001, chunk_times=times,
                         end=times[-1], output_tokens=8, input_tokens=32, usage_reported=True, status=200,
                         text=" t" * 8)


def sample_run(concurrency: int = 2) -> RunResult:
    records = [finished(i, 0.1 * i, 0.05 + 0.01 * i) for i in range(6)]
    records.append(RequestRecord(index=6, scheduled=0.7, status=503, error="503", error_detail="overloaded",
                                 end=0.71))
    return RunResult(LoadProfile(concurrency=concurrency, num_requests=7), records, duration=1.5,
                     started_at="2026-11-29T12:00:00+00:00")


def test_json_round_trips_summary_and_per_request_records(tmp_path: Path) -> None:
    run = sample_run()
    summary = run.summary(Slo.parse("ttft:90")) | {"requests": [r.to_dict() for r in run.records]}
    write_json(tmp_path / "out.json", summary)
    [back] = read_summaries(tmp_path / "out.json")
    assert back == summary
    assert [RequestRecord.from_dict(r) for r in back["requests"]] == run.records
    for key in ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
                "request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
                *(f"{stat}_{m}_ms" for stat in ("mean", "median", "p95", "p99")
                  for m in ("ttft", "tpot", "itl", "e2el"))):
        assert key in back, key


def test_sweep_json_reads_back_as_its_levels(tmp_path: Path) -> None:
    levels = [sample_run(c).summary() for c in (1, 2, 4)]
    write_json(tmp_path / "sweep.json", {"sweep": levels})
    assert [s["max_concurrency"] for s in read_summaries(tmp_path / "sweep.json")] == [1, 2, 4]


@pytest.mark.parametrize("content", ['[1, 2]', '{"sweep": [{"nope": 1}]}', '{"model": "x"}'])
def test_foreign_json_is_not_taken_for_results(tmp_path: Path, content: str) -> None:
    (tmp_path / "x.json").write_text(content)
    with pytest.raises(ValueError):
        read_summaries(tmp_path / "x.json")


def test_csv_has_one_row_per_run_with_errors_by_status(tmp_path: Path) -> None:
    levels = [sample_run(c).summary() for c in (1, 2)]
    write_csv(tmp_path / "runs.csv", levels)
    with (tmp_path / "runs.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [row["max_concurrency"] for row in rows] == ["1", "2"]
    assert rows[0]["errors"] == "503:1"
    assert float(rows[0]["p99_ttft_ms"]) == pytest.approx(levels[0]["p99_ttft_ms"])


def test_console_table_shows_failures_and_a_generator_that_fell_behind() -> None:
    summary = sample_run().summary() | {"generator_kept_up": False, "offered_rate": 50.0, "client_bound": True}
    text = format_summary(summary)
    assert "not the server, may be the bottleneck" in text
    assert "Serving Benchmark Result" in text
    assert "failed with 503:" in text
    assert "P99 TTFT (ms):" in text
    assert "fell behind" in text


def test_sweep_table_has_a_row_per_level_and_goodput_when_judged() -> None:
    slo = Slo.parse("ttft:90")
    table = format_sweep([sample_run(c).summary(slo) for c in (1, 2, 4)])
    lines = table.splitlines()
    assert len(lines) == 5 and "goodput" in lines[0]
    assert lines[2].startswith("| 1 |") and lines[4].startswith("| 4 |")


def test_sweep_png_is_written_headless(tmp_path: Path) -> None:
    plot_sweep(tmp_path / "sweep.png", [sample_run(c).summary() for c in (1, 2, 4, 8)], "test")
    data = (tmp_path / "sweep.png").read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 10_000


def test_summary_is_plain_json_even_when_nothing_met_the_slo_or_completed() -> None:
    all_failed = RunResult(LoadProfile(concurrency=1, num_requests=1),
                           [RequestRecord(index=0, scheduled=0.0, status=503, error="503", end=0.01)],
                           duration=0.5, started_at="2026-11-29T12:00:00+00:00")
    for run, completed in ((sample_run(), 6), (all_failed, 0)):
        summary = json.loads(json.dumps(run.summary(Slo(ttft_ms=10)), allow_nan=False))  # no NaN, no inf
        assert (summary["completed"], summary["errors"]) == (completed, {"503": 1})
        assert summary["request_goodput"] == 0.0 and summary["slo_attainment"] == 0.0  # every TTFT is over 10 ms
    assert summary["p99_ttft_ms"] == 0.0 and summary["output_throughput"] == 0.0  # numbers, where none was timed


def test_console_table_names_the_workload_and_the_output_lengths_generated() -> None:
    summary = sample_run().summary() | {"workload": "realistic", "ignore_eos": False}
    text = format_summary(summary)
    assert "Workload:" in text and "realistic" in text and "ignore_eos sent:" in text
    assert "Output tokens per request, mean/P50/P95:" in text
    assert "mean out len" in format_sweep([summary])
