"""`tidegate bench` end to end against the scripted server: files written, plans printed, bad flags refused."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from bench.scripted_server import Script
from tests.servers import free_port
from tidegate.cli import main

Mock = Callable[[Script], AbstractContextManager[str]]
FAST = ["--input-len", "32", "--output-len", "6", "--no-progress"]


def test_single_run_writes_json_csv_and_requests(mock: Mock, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with mock(Script(ttft=0.02, gap=0.005, fail={3: 429})) as url:
        code = main(["bench", "--base-url", url, "--model", "m", "--concurrency", "2", "--num-requests", "6",
                     "--slo", "ttft:1000", "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv"),
                     "--save-requests", *FAST])
    assert code == 0
    out = capsys.readouterr().out
    assert "Serving Benchmark Result" in out and "failed with 429:" in out
    data = json.loads((tmp_path / "r.json").read_text())
    assert (data["completed"], data["failed"], data["errors"]) == (5, 1, {"429": 1})
    assert data["total_input_tokens"] == 5 * 32 and data["total_output_tokens"] == 5 * 6
    assert data["request_goodput"] > 0 and data["max_concurrency"] == 2
    assert len(data["requests"]) == 6
    with (tmp_path / "r.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == 1


def test_progress_line_goes_to_stderr(mock: Mock, capsys: pytest.CaptureFixture[str]) -> None:
    with mock(Script(ttft=0.01, gap=0.002)) as url:
        assert main(["bench", "--base-url", f"{url}/v1", "--model", "m", "--num-requests", "3",
                     "--input-len", "8", "--output-len", "2"]) == 0
    err = capsys.readouterr().err
    assert "c=1 [########################] 100% 3/3 ok 3 failed 0" in err


def test_sweep_plots_and_plans(mock: Mock, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with mock(Script(ttft=0.02, gap=0.005)) as url:
        code = main(["bench", "--base-url", url, "--model", "m", "--sweep", "1,2,4", "--num-requests", "8",
                     "--slo", "ttft:2000,tpot:500", "--plan", "--peak-qps", "30", "--headroom", "1.5",
                     "--png", str(tmp_path / "s.png"), "--json", str(tmp_path / "s.json"),
                     "--save-requests", *FAST])
    assert code == 0
    out = capsys.readouterr().out
    assert "| conc |" in out and "Capacity plan" in out and "Little's law" in out
    data = json.loads((tmp_path / "s.json").read_text())
    assert [s["max_concurrency"] for s in data["sweep"]] == [1, 2, 4]
    assert data["plan"]["concurrency"] == 4 and data["plan"]["instances"] >= 1
    assert (tmp_path / "s.png").read_bytes().startswith(b"\x89PNG")

    # the saved records are re-judged against a new SLO without sending anything: nothing meets 1 ms
    code = main(["bench", "--plan", "--from-json", str(tmp_path / "s.json"), "--slo", "ttft:1",
                 "--peak-qps", "30", "--png", str(tmp_path / "again.png"), "--csv", str(tmp_path / "again.csv")])
    assert code == 1
    captured = capsys.readouterr()
    assert "no swept level meets the SLO" in captured.err
    assert "| conc |" in captured.out
    assert (tmp_path / "again.png").read_bytes().startswith(b"\x89PNG")
    with (tmp_path / "again.csv").open() as fh:
        assert [row["slo"] for row in csv.DictReader(fh)] == ["ttft:1"] * 3


def test_from_json_of_a_missing_file_fails_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--from-json", str(tmp_path / "absent.json")]) == 1
    assert capsys.readouterr().err.startswith("tidegate bench:")


def test_unreachable_server_exits_nonzero_with_errors_counted(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--base-url", f"http://127.0.0.1:{free_port()}", "--model", "m",
                 "--num-requests", "2", *FAST])
    assert code == 1
    assert "failed with connect_error:" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "m"], "--base-url and --model are required"),
    (["--base-url", "http://x", "--model", "m", "--slo", "ttft:fast"], "not a number"),
    (["--base-url", "http://x", "--model", "m", "--png", "p.png"], "--png and --plan need a sweep"),
    (["--base-url", "http://x", "--model", "m", "--plan"], "--plan needs --slo and --peak-qps"),
    (["--base-url", "http://x", "--model", "m", "--plan", "--slo", "ttft:5", "--peak-qps", "3"],
     "--png and --plan need a sweep"),
    (["--base-url", "ftp://x", "--model", "m"], "http:// or https://"),
    (["--base-url", "http://x", "--model", "m", "--concurrency", "0"], "--concurrency must be at least 1"),
    (["--base-url", "http://x", "--model", "m", "--input-len", "0"], "--input-len"),
    (["--base-url", "http://x", "--model", "m", "--dataset", "/nonexistent.jsonl"], "cannot read dataset"),
    (["--from-json", "x.json", "--json", "x.json"], "--json would overwrite --from-json"),
])
def test_bad_flags_exit_2_with_a_reason(argv: list[str], message: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tidegate bench:") and message in err


@pytest.mark.parametrize("argv", [["--concurrency", "1", "--rate", "2"], ["--sweep", "1,x"], ["--sweep", "0"],
                                  ["--num-requests", "1", "--duration", "2"]])
def test_conflicting_flags_are_argparse_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--base-url", "http://x", "--model", "m", *argv])
    assert exc.value.code == 2


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_realistic_workload_runs_to_eos_and_says_so(mock: Mock, tmp_path: Path, endpoint: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    script = Script(ttft=0.01, gap=0.002, eos_after=5, fail={4: 500})
    with mock(script) as url:
        code = main(["bench", "--base-url", url, "--model", "m", "--endpoint", endpoint, "--workload", "realistic",
                     "--concurrency", "2", "--num-requests", "16", "--output-len", "40", "--seed", "1",
                     "--no-progress", "--json", str(tmp_path / "r.json")])
    assert code == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert (data["workload"], data["ignore_eos"], data["input_len"], data["output_len"]) == (
        "realistic", False, None, 40)
    # every answer ended at the model's EOS, well under the cap, and the failure stays beside throughput
    assert (data["completed"], data["failed"]) == (15, 1)
    assert data["mean_output_len"] == data["median_output_len"] == data["p95_output_len"] == 5
    assert data["total_output_tokens"] == 15 * 5 and data["request_throughput"] == pytest.approx(
        15 / data["duration"])
    out = capsys.readouterr().out
    assert "Workload:" in out and "realistic" in out and "Output tokens per request, mean/P50/P95:" in out
    assert "5.0/5/5" in out and "Failed requests:" in out
    limit = "max_completion_tokens" if endpoint.endswith("chat/completions") else "max_tokens"
    assert all("ignore_eos" not in b and b[limit] == 40 for b in script.bodies)
    if endpoint.endswith("chat/completions"):
        # later turns of the set's chats carry the history with the server's own answers
        assert any([m["role"] for m in b["messages"]][-3:] == ["user", "assistant", "user"] for b in script.bodies)
    else:
        assert all(b["prompt"].endswith("Assistant:") for b in script.bodies)
