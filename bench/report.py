"""Results out: the console table, JSON (the source of truth, vLLM's key names), CSV, and the sweep PNG."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.metrics import METRICS

_TITLES = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
           "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.{digits}f}"
    return str(value)


def _lengths(s: dict[str, Any]) -> str | None:
    if "mean_output_len" not in s:  # a result saved before these figures existed
        return None
    return f"{s['mean_output_len']:.1f}/{s['median_output_len']:.0f}/{s['p95_output_len']:.0f}"


def format_summary(s: dict[str, Any]) -> str:
    """One run as vLLM prints it, plus errors by status, client queueing and the achieved rate."""
    rows: list[tuple[str, Any]] = [
        ("Workload:", s.get("workload")),
        ("ignore_eos sent:", s.get("ignore_eos")),
        ("Max concurrency:", s.get("max_concurrency")),
        ("Requested rate (req/s):", s.get("requested_rate")),
        ("Successful requests:", s["completed"]),
        ("Failed requests:", s["failed"]),
    ]
    rows += [(f"  failed with {kind}:", count) for kind, count in s.get("errors", {}).items()]
    if s.get("retried_on_fresh_connection"):
        rows.append(("  retried after a closed kept-alive conn.:", s["retried_on_fresh_connection"]))
    rows += [
        ("Benchmark duration (s):", s["duration"]),
        ("Total input tokens:", s["total_input_tokens"]),
        ("Total generated tokens:", s["total_output_tokens"]),
        ("Output tokens per request, mean/P50/P95:", _lengths(s)),
        ("Request throughput (req/s):", s["request_throughput"]),
    ]
    if "request_goodput" in s:
        rows += [(f"Request goodput (req/s) @ {s.get('slo', '')}:", s["request_goodput"]),
                 ("Share of requests within SLO:", s["slo_attainment"])]
    rows += [("Output token throughput (tok/s):", s["output_throughput"]),
             ("Total token throughput (tok/s):", s["total_token_throughput"])]
    lines = ["{:=^60}".format(" Serving Benchmark Result ")]
    lines += [f"{label:<44}{_num(value):>16}" for label, value in rows]
    for name in METRICS:
        lines.append(f"{_TITLES[name]:-^60}")
        for stat in ("mean", "median", "p95", "p99"):
            lines.append(f"{f'{stat.capitalize()} {name.upper()} (ms):':<44}{_num(s[f'{stat}_{name}_ms']):>16}")
    lines.append("{:-^60}".format("Load generator"))
    lines.append(f"{'Mean client-side queueing (ms):':<44}{_num(s['mean_client_queue_ms']):>16}")
    lines.append(f"{'P99 client-side queueing (ms):':<44}{_num(s['p99_client_queue_ms']):>16}")
    if s.get("offered_rate") is not None:
        lines.append(f"{'Offered rate (req/s):':<44}{_num(s['offered_rate']):>16}")
    lines.append(f"{'Achieved send rate (req/s):':<44}{_num(s['achieved_rate']):>16}")
    if not s.get("generator_kept_up", True):
        lines.append("WARNING: the load generator fell behind its schedule; less load was offered than requested")
    if s.get("client_bound"):
        lines.append("WARNING: client-side queueing is a large share of TTFT; the load generator, not the "
                     "server, may be the bottleneck")
    if not s.get("usage_reported", True):
        lines.append("NOTE: the server sent no usage; output tokens are counted as text chunks")
    lines.append("=" * 60)
    return "\n".join(lines)


SWEEP_COLUMNS = (("conc", "max_concurrency", 0), ("ok", "completed", 0), ("fail", "failed", 0),
                 ("req/s", "request_throughput", 2), ("out tok/s", "output_throughput", 1),
                 ("mean out len", "mean_output_len", 1), ("P95 out len", "p95_output_len", 1),
                 ("P50 TTFT", "median_ttft_ms", 1), ("P95 TTFT", "p95_ttft_ms", 1),
                 ("P99 TTFT", "p99_ttft_ms", 1), ("P95 TPOT", "p95_tpot_ms", 1),
                 ("P99 TPOT", "p99_tpot_ms", 1), ("P95 E2EL", "p95_e2el_ms", 1))


def format_sweep(summaries: Sequence[dict[str, Any]]) -> str:
    """One row per concurrency level (latencies in ms); goodput when an SLO was given."""
    columns = list(SWEEP_COLUMNS)
    if any("request_goodput" in s for s in summaries):
        columns.insert(4, ("goodput", "request_goodput", 2))
    header = " | ".join(title for title, _, _ in columns)
    lines = [f"| {header} |", "|" + "|".join("---" for _ in columns) + "|"]
    for s in summaries:
        cells = [_num(s.get(key), digits) if digits else _num(s.get(key)) for _, key, digits in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_json(path: Path, data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def read_summaries(path: Path) -> list[dict[str, Any]]:
    """The run summaries in a JSON written by `tidegate bench` (a single run or a sweep)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a tidegate bench result")
    runs = data.get("sweep", [data])
    if not all(isinstance(s, dict) and "completed" in s for s in runs):
        raise ValueError(f"{path} is not a tidegate bench result")
    return list(runs)


def write_csv(path: Path, summaries: Sequence[dict[str, Any]]) -> None:
    """One row per run, every scalar figure a column; errors as `status:count` pairs."""
    rows = []
    for s in summaries:
        row = {k: v for k, v in s.items() if not isinstance(v, list | dict)}
        row["errors"] = ";".join(f"{k}:{v}" for k, v in s.get("errors", {}).items())
        rows.append(row)
    fields = list(dict.fromkeys(key for row in rows for key in row))
    with Path(path).open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def plot_sweep(path: Path, summaries: Sequence[dict[str, Any]], title: str = "") -> None:
    """P95 TTFT, P95 TPOT and output throughput against concurrency, drawn headless."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [s["max_concurrency"] for s in summaries]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = (("p95_ttft_ms", "P95 TTFT (ms)"), ("p95_tpot_ms", "P95 TPOT (ms)"),
              ("output_throughput", "output throughput (tok/s)"))
    for ax, (key, label) in zip(axes, panels, strict=True):
        ax.plot(levels, [s[key] for s in summaries], marker="o")
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrency")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    for s in summaries:  # failed requests are missing from every curve, so they are named on the plot
        if s["failed"]:
            axes[2].annotate(f"{s['failed']} failed", (s["max_concurrency"], s["output_throughput"]),
                             textcoords="offset points", xytext=(0, -14), ha="center", color="tab:red",
                             fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
