"""What the store hands to the signals stage: the stored points of one target over a time range."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from tuner.collect.snapshots import SeriesKey

__all__ = ["Point", "HistPoint", "HistSeries", "EngineWindow", "TargetWindow", "TargetHealth", "GpuLatest"]

Point = tuple[int, float]  # (ts_ms, value)


@dataclass(frozen=True)
class HistPoint:
    ts_ms: int
    counts: tuple[float, ...]  # cumulative, aligned with HistSeries.bounds
    sum: float
    count: float


@dataclass(frozen=True)
class HistSeries:
    bounds: tuple[float, ...]  # ascending upper bounds, last +Inf
    points: tuple[HistPoint, ...]  # ascending ts


@dataclass(frozen=True)
class EngineWindow:
    engine: str
    model_name: str
    series: Mapping[SeriesKey, tuple[Point, ...]]  # counters and gauges, ascending ts
    hists: Mapping[SeriesKey, HistSeries]
    config: Mapping[str, str] = field(default_factory=dict)  # latest config seen


@dataclass(frozen=True)
class TargetHealth:
    health: str  # up | degraded | down
    last_error: str
    last_scrape_ms: int
    last_success_ms: int | None
    last_duration_s: float
    consecutive_failures: int
    server_healthy: bool | None


@dataclass(frozen=True)
class TargetWindow:
    target: str
    backend: str
    start_ms: int
    end_ms: int
    engines: tuple[EngineWindow, ...]
    health: TargetHealth | None


@dataclass(frozen=True)
class GpuLatest:
    ts_ms: int
    index: int
    uuid: str
    name: str
    utilization: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperature_c: float | None
    power_w: float | None
    processes: tuple[tuple[int, str, int | None], ...]  # (pid, name, used bytes)
