"""Settings of `tidegate up`'s autoscaler (`--replicas MIN:MAX`): how often it looks, what it aims for, how patient it is.

`tidegate up` generates a flag for every field here (`scale_up_window` is `--scale-up-window`); each is also
`TIDEGATE_AUTOSCALE__...` in the environment.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AutoscaleSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metrics_interval: float = Field(default=1.0, gt=0, description="seconds between reads of the replicas' /metrics")
    scale_up_window: float = Field(
        default=10.0, ge=0, description="seconds the load must stay above a target before a replica is added")
    scale_down_window: float = Field(
        default=60.0, ge=0, description="seconds the load must stay low before a replica is drained and stopped")
    cooldown: float = Field(default=30.0, ge=0, description="seconds after one change before the next")
    target_waiting: float = Field(
        default=4.0, ge=0, description="requests waiting per replica above which the load is too high")
    target_ttft_p95: float = Field(
        default=5.0, gt=0, description="seconds of P95 time to first token above which the load is too high")
    replica_ready_timeout: float = Field(
        default=300.0, gt=0, description="seconds a new replica may take to load its model and become healthy")
