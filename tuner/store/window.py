"""What the store hands to the signals stage: the stored points of one target over a time range."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field, replace
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

    def since(self, start_ms: int) -> "TargetWindow":
        """The same window from ``start_ms`` on: the points a read of [start_ms, end_ms] gives when this window
        holds every stored point (a window within the raw retention); series and engines left with no point are
        left out, as such a read leaves them."""
        engines = []
        for e in self.engines:
            series = {}
            for key, pts in e.series.items():
                kept = pts[bisect_left(pts, (start_ms,)):]
                if kept:
                    series[key] = kept
            hists = {}
            for key, h in e.hists.items():
                i = bisect_left(h.points, start_ms, key=lambda p: p.ts_ms)
                if i < len(h.points):
                    hists[key] = HistSeries(h.bounds, h.points[i:])
            if series or hists:
                engines.append(replace(e, series=series, hists=hists))
        return replace(self, start_ms=start_ms, engines=tuple(engines))


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
