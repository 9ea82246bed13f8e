"""tuner's own loop as signals: the values the rules over tuner itself read, from tuner's own series.

The series are what tuner's exporter serves (``tuner_scrape_failures_total``, ``tuner_alert_notifications_queued``,
``tuner_applies_last_hour``, ...), sampled over time: the daemon records its own (app/selfwatch.py), a scenario
file writes them out, and a Prometheus scraping tuner holds the same. Each signal is the arithmetic of its PromQL
twin in tuner/rules/signals.py, so the rule and its exported twin agree. Pure: the points and the evaluation time
come in as arguments.

``points(metric)`` gives, per ``target`` label value ("" for a series without one), that series' points
``(ts_ms, value)`` in time order, none after ``now_ms``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tuner.signals.promql import rate
from tuner.store.window import Point

__all__ = ["SELF_SERIES", "LOOKBACK_MS", "self_signal", "SeriesByTarget"]

LOOKBACK_MS = 5 * 60 * 1000  # Prometheus's lookback delta: a gauge's value is its newest sample at most this old
SeriesByTarget = Mapping[str, Sequence[Point]]

# signal -> the series it reads (what the daemon records, and a scenario must give)
SELF_SERIES: dict[str, tuple[str, ...]] = {
    "auto_apply_halted": ("tuner_auto_apply_halted",),
    "applies_per_hour": ("tuner_applies_last_hour",),
    "flag_flips": ("tuner_apply_flag_flips",),
    "auto_evaluations_missed": ("tuner_auto_last_evaluation_timestamp_seconds", "tuner_auto_interval_seconds"),
    "scrape_errors_per_minute": ("tuner_scrape_failures_total",),
    "all_scrape_errors_per_minute": ("tuner_scrape_failures_total",),
    "notifications_queued_growth": ("tuner_alert_notifications_queued",),
}


def _latest(pts: Sequence[Point], now_ms: int) -> float | None:
    """The instant value at ``now_ms``: the newest sample within the lookback."""
    for ts, v in reversed(pts):
        if ts <= now_ms:
            return v if now_ms - ts <= LOOKBACK_MS else None
    return None


def _cut(pts: Sequence[Point], lo: int, hi: int) -> list[Point]:
    return [(ts, v) for ts, v in pts if lo <= ts <= hi]


def self_signal(
    signal: str, target: str, window_s: float, now_ms: int, points: Callable[[str], SeriesByTarget]
) -> float | None:
    """The value of one of tuner's own signals for ``target`` ("" for a tuner signal) at ``now_ms``; None when the
    series it reads have no sample to give it (as the PromQL twin returns no sample)."""
    lo = now_ms - int(window_s * 1000)
    if signal in ("auto_apply_halted", "applies_per_hour", "flag_flips"):
        pts = points(SELF_SERIES[signal][0]).get(target)
        return _latest(pts, now_ms) if pts else None
    if signal == "auto_evaluations_missed":
        last = _latest(points("tuner_auto_last_evaluation_timestamp_seconds").get(target) or (), now_ms)
        every = _latest(points("tuner_auto_interval_seconds").get(target) or (), now_ms)
        if last is None or not every:
            return None
        return (now_ms / 1000 - last) / every
    if signal == "scrape_errors_per_minute":
        r = rate(_cut(points("tuner_scrape_failures_total").get(target) or (), lo, now_ms), lo, now_ms)
        return None if r is None else r * 60
    if signal == "all_scrape_errors_per_minute":
        rates = [
            r
            for pts in points("tuner_scrape_failures_total").values()
            if (r := rate(_cut(pts, lo, now_ms), lo, now_ms)) is not None
        ]
        return sum(rates) * 60 if rates else None
    if signal == "notifications_queued_growth":
        series = list(points("tuner_alert_notifications_queued").values())
        latest = [v for pts in series if (v := _latest(pts, now_ms)) is not None]
        lows = [min(v for _, v in cut) for pts in series if (cut := _cut(pts, lo, now_ms))]
        return max(latest) - min(lows) if latest and lows else None
    raise KeyError(f"{signal} is not one of tuner's own signals ({', '.join(sorted(SELF_SERIES))})")
