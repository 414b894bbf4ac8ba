"""The Files and Batch APIs: how large an input may be, and how the dispatcher feeds lines in beside realtime
traffic."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class BatchSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    # where uploaded files and batch output files are kept; default: the data dir's `files` folder. Replicas that
    # share a Redis must share this folder too (one volume), as they share the files' records
    files_dir: Path | None = None
    max_file_bytes: int = Field(default=100 * 1024 * 1024, ge=1024)
    max_lines: int = Field(default=50_000, ge=1)
    max_line_bytes: int = Field(default=1024 * 1024, ge=256)  # one request; a longer line is an error in its file
    # lines one replica runs at once, in the `batch` priority class (keep it at or below that class's pool)
    max_in_flight: int = Field(default=8, ge=1)
    # a line leased by a replica that dies is taken over after this; a live replica renews it while it runs
    lease_seconds: float = Field(default=30.0, ge=1.0)
    poll_interval: float = Field(default=0.25, gt=0)
    # the dispatcher halves its lines in flight while a more important class has this many requests queued ...
    yield_queued: int = Field(default=1, ge=1)
    # ... or its recent P95 time to first token (in the gateway, queueing included) is above this
    yield_ttft_seconds: float = Field(default=1.0, gt=0)
    # ... or, when set, it has this many requests in flight: 1 runs batch lines only in realtime's idle gaps (for
    # replicas where any concurrent work slows every request, as on a CPU); null: in flight alone never yields
    yield_active: int | None = Field(default=None, ge=1)
    # a line refused for now (429 rate limit, 503 overloaded) is tried again after this
    retry_delay: float = Field(default=2.0, ge=0)

    def folder(self, data_dir: Path) -> Path:
        return (self.files_dir or data_dir / "files").expanduser()
