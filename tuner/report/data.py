"""What a report shows, read from the store: signals over sliding windows, alert events, applies, tuning runs.

Signals come from ``compute_signals`` (the same arithmetic as ``tuner signals``) evaluated every ``step`` over
the ``window`` before it. The store is read once per target and the points are cut per window in memory.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.config import Slo
from tuner.signals.derive import EngineSignals, compute_signals
from tuner.store.alerts import history
from tuner.store.journal import list_applies
from tuner.store.store import Store
from tuner.store.tuning import runs_since, trials
from tuner.store.window import EngineWindow, HistSeries, TargetWindow

__all__ = ["PLOTS", "Plot", "TargetReport", "AlertEvent", "ApplyView", "APPLY_VIEW_PLOTS", "collect"]


@dataclass(frozen=True)
class Plot:
    key: str
    title: str
    unit: str  # "s" | "ratio" | "count" | "per_s"
    lines: tuple[tuple[str, str], ...]  # (EngineSignals field, legend)


PLOTS = (
    Plot("ttft", "Time to first token", "s", (("ttft_p50", "P50"), ("ttft_p99", "P99"))),
    Plot("e2e", "End-to-end latency", "s", (("e2e_p50", "P50"), ("e2e_p99", "P99"))),
    Plot("kv", "KV-cache use (peak in window)", "ratio", (("kv_cache_usage_max", "KV use"),)),
    Plot(
        "queue",
        "Requests running / waiting",
        "count",
        (("requests_running_max", "running (peak)"), ("requests_waiting_max", "waiting (peak)")),
    ),
    Plot(
        "throughput",
        "Tokens per second",
        "per_s",
        (("prompt_tokens_per_s", "prompt"), ("generation_tokens_per_s", "generated")),
    ),
)


@dataclass(frozen=True)
class AlertEvent:
    ts_ms: int
    alertname: str
    from_state: str
    to_state: str
    value: float
    labels: dict[str, str]


@dataclass
class TargetReport:
    target: str
    backend: str
    start_ms: int
    end_ms: int
    window_s: float
    # (engine, model) -> plot key -> legend -> [(ts_ms, value | None)]
    series: dict[tuple[str, str], dict[str, dict[str, list[tuple[int, float | None]]]]] = field(default_factory=dict)
    alerts: list[AlertEvent] = field(default_factory=list)
    applies: list[Any] = field(default_factory=list)  # tuner.store.journal.StoredApply, newest first
    tunes: list[tuple[Any, list[Any]]] = field(default_factory=list)  # (StoredRun, its StoredTrials), newest first
    apply_views: dict[int, Any] = field(default_factory=dict)  # apply id -> ApplyView


def _cut(points: Sequence[Any], lo: int, hi: int, ts: Any) -> Sequence[Any]:
    keys = [ts(p) for p in points]
    return points[bisect.bisect_left(keys, lo) : bisect.bisect_right(keys, hi)]


def _slice(win: TargetWindow, lo: int, hi: int) -> TargetWindow:
    engines = []
    for e in win.engines:
        series = {k: _cut(pts, lo, hi, lambda p: p[0]) for k, pts in e.series.items()}
        hists = {k: HistSeries(h.bounds, _cut(h.points, lo, hi, lambda p: p.ts_ms)) for k, h in e.hists.items()}
        engines.append(EngineWindow(e.engine, e.model_name, series, hists, e.config))
    return TargetWindow(win.target, win.backend, lo, hi, tuple(engines), win.health)


def _value(sig: EngineSignals, name: str) -> float | None:
    v = getattr(sig, name)
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


Series = dict[tuple[str, str], dict[str, dict[str, list[tuple[int, float | None]]]]]

# Around each apply: from a baseline's length before it starts to 30 s after its last step, these plots.
APPLY_VIEW_PLOTS = ("e2e", "queue", "throughput")
_APPLY_VIEW_AFTER_S = 30.0
_APPLY_VIEW_POINTS = 60


@dataclass
class ApplyView:
    """One apply's own before/after view: the signals from before it started to after it ended."""

    apply_id: int
    start_ms: int
    end_ms: int
    window_s: float
    series: Series = field(default_factory=dict)


def _series(
    store: Store,
    target: str,
    start: float,
    end: float,
    points: int,
    window_s: float,
    slo: Slo | None,
    keys: tuple[str, ...] | None = None,
) -> tuple[str, Series]:
    """(backend, signals at ``points`` times from ``start`` to ``end``, each over the ``window_s`` before it)."""
    step = (end - start) / max(1, points - 1)
    whole = store.window(target, start - window_s, end)
    out: Series = {}
    for i in range(points):
        hi = int((start + i * step) * 1000)
        sig = compute_signals(_slice(whole, hi - int(window_s * 1000), hi), slo=slo)
        for e in sig.engines:
            plots = out.setdefault((e.engine, e.model_name), {})
            for plot in PLOTS:
                if keys is not None and plot.key not in keys:
                    continue
                for name, legend in plot.lines:
                    plots.setdefault(plot.key, {}).setdefault(legend, []).append((hi, _value(e, name)))
    return whole.backend, out


def collect(
    store: Store,
    target: str,
    *,
    start: float,
    end: float,
    points: int = 120,
    window_s: float | None = None,
    slo: Slo | None = None,
    baseline_s: float = 300.0,
) -> TargetReport:
    """Signals of ``target`` at ``points`` times from ``start`` to ``end``, its alert events and applies, each
    apply with its own view from ``baseline_s`` before it to 30 s after it."""
    step = (end - start) / max(1, points - 1)
    window_s = window_s or max(2 * step, 10.0)
    backend, series = _series(store, target, start, end, points, window_s, slo)
    rep = TargetReport(target, backend, int(start * 1000), int(end * 1000), window_s, series=series)
    for ev in reversed(history(store, since_ms=rep.start_ms, limit=10_000)):
        labels = json.loads(ev.labels)
        if labels.get("target") == target and ev.ts_ms <= rep.end_ms:
            rep.alerts.append(
                AlertEvent(ev.ts_ms, labels.get("alertname", ev.rule), ev.from_state, ev.to_state, ev.value, labels)
            )
    rep.applies = _applies(store, target, rep.start_ms)
    for ap in rep.applies[:10]:  # the newest ten
        lo, hi = ap.created_ms / 1000 - baseline_s, ap.updated_ms / 1000 + _APPLY_VIEW_AFTER_S
        view_window = max(2 * (hi - lo) / (_APPLY_VIEW_POINTS - 1), 10.0)
        _, vs = _series(store, target, lo, hi, _APPLY_VIEW_POINTS, view_window, slo, APPLY_VIEW_PLOTS)
        rep.apply_views[ap.id] = ApplyView(ap.id, int(lo * 1000), int(hi * 1000), view_window, vs)
    rep.tunes = [(run, trials(store.engine, run.id)) for run in runs_since(store.engine, target, rep.start_ms)]
    return rep


def _applies(store: Store, target: str, since_ms: int) -> list[Any]:
    """The applies (and restarts) of the period; a tuning run's entry in the journal, which only held the target,
    is not one: its run has its own section."""
    return [a for a in list_applies(store.engine, target=target, since_ms=since_ms) if a.kind != "tune"]
