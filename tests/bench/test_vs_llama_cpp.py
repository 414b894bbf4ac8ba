"""The side-by-side script's pure parts: the bench runs it asks for, its table and its failure report."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.backend.vs_llama_cpp import (
    bench_command,
    failed_runs,
    memory_table,
    shape_list,
    speculation_list,
    table,
    tree_rss,
    workload_list,
)


def run(tok_s: float, failed: int = 0, out_len: float = 50.0) -> dict[str, Any]:
    return {"output_throughput": tok_s, "failed": failed, "errors": {"500": failed} if failed else {},
            "mean_output_len": out_len, "p95_ttft_ms": 1500.0, "median_tpot_ms": 20.0}


def test_both_workloads_are_the_default_and_realistic_sends_no_length_flags(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", type=workload_list, default=["random", "realistic"])
    assert parser.parse_args([]).workloads == ["random", "realistic"]
    assert workload_list("realistic,random,realistic") == ["realistic", "random"]
    with pytest.raises(argparse.ArgumentTypeError):
        workload_list("random,chatty")
    command = bench_command("http://127.0.0.1:1", 8, "realistic", tmp_path / "r.json")
    assert command[command.index("--workload") + 1] == "realistic"
    assert "--no-ignore-eos" not in command and command[command.index("--num-requests") + 1] == "16"


def test_table_gives_each_workload_and_level_with_failures_beside_throughput() -> None:
    results = {"tidegate": {"random": {1: run(150.0), 8: run(160.0)}, "realistic": {1: run(90.0, out_len=42)}},
               "llama.cpp": {"random": {1: run(50.0), 8: run(80.0, failed=3)}, "realistic": {1: run(45.0)}}}
    lines = table(results).splitlines()
    assert "tidegate failed" in lines[0] and "llama.cpp failed" in lines[0] and "mean out len" in lines[0]
    assert len(lines) == 2 + 3
    assert lines[2].startswith("| random | 1 | 150.0 | 0 |") and lines[2].endswith("| 3.00x |")
    assert "| 80.0 | 3 |" in lines[3] and lines[4].startswith("| realistic | 1 | 90.0 | 0 | 42 |")
    assert failed_runs(results) == ["llama.cpp random c=8: 3 failed {'500': 3}"]


def test_tidegate_alone_has_dashes_for_llama_cpp() -> None:
    lines = table({"tidegate": {"realistic": {32: run(100.0)}}}).splitlines()
    assert lines[2].endswith("| - | - | - | - | - | - |")


def test_help_runs_without_llama_server() -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.backend.vs_llama_cpp", "--help"], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).resolve().parents[2]).stdout
    assert "--llama-server" in out and "--workloads" in out


def test_real_shape_and_speculation_flags_and_the_memory_table() -> None:
    assert shape_list("qwen2.5-0.5b,llama3.2-1b") == ["qwen2.5-0.5b", "llama3.2-1b"]
    assert speculation_list("off,on,off") == ["off", "on"]
    for bad in (lambda: shape_list("gpt2-xl"), lambda: speculation_list("maybe")):
        with pytest.raises(argparse.ArgumentTypeError):
            bad()
    memory = {"tidegate spec off": {"ready_rss_mib": 700.0, "peak_rss_mib": 900.0},
              "llama.cpp": {"ready_rss_mib": 500.0, "peak_rss_mib": 600.0}}
    lines = memory_table(memory).splitlines()
    assert lines[2] == "| tidegate spec off | 700 MiB | 900 MiB | 1.50x |"
    assert lines[3] == "| llama.cpp | 500 MiB | 600 MiB | 1.00x |"


def test_tree_rss_counts_a_live_process_and_nothing_once_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # running, not still being exec'd
        assert tree_rss(proc.pid) > 1 << 20  # a Python interpreter holds megabytes
    finally:
        proc.communicate(b"")
    assert tree_rss(proc.pid) == 0
