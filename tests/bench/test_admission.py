from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gateway.admission import main


def test_admission_bench_reports_one_script_call_per_redis_admission(tmp_path: Path) -> None:
    out = tmp_path / "admission.json"
    main(["--admissions", "600", "--concurrency", "16", "--json", str(out)])
    figures = {f["name"]: f for f in json.loads(out.read_text())}
    assert set(figures) == {"baseline: empty async call", "embedded store", "embedded store, buckets on",
                            "baseline: `return 1` script, same batching", "Redis store", "Redis store, buckets on"}
    assert figures["Redis store"]["redis_commands"] == 1.0
    assert figures["Redis store, buckets on"]["redis_commands"] == 1.0  # the buckets add no round trip
    assert all(f["per_second"] > 0 and f["admissions"] == 600 for f in figures.values())
