"""tuner's own series over time: its counters and gauges sampled as a Prometheus scraping tuner would hold them,
so the rules over tuner's own loop (scrape errors a minute, the outbox's growth, applies in the last hour, auto
mode's missed evaluations) read them through the same arithmetic as their exported twins (signals/selfwatch.py).

The daemon records them at its apply-status tick; only as much history as the rules' longest window is kept.
"""

from __future__ import annotations

import threading
from collections import deque

from tuner.rules.model import RuleSet
from tuner.rules.signals import SELF_SIGNALS
from tuner.signals.selfwatch import SeriesByTarget
from tuner.store.window import Point

__all__ = ["SelfSeries", "keep_for"]

_STEP_SLACK_S = 30.0


def keep_for(rules: RuleSet) -> float:
    """Seconds of history the rules over tuner's own signals need: their longest window, at least 5 minutes (a
    gauge's newest sample within Prometheus's lookback), and a little more."""
    return max([300.0, *(r.window.total_seconds() for r in rules.rules if r.signal in SELF_SIGNALS)]) + _STEP_SLACK_S


class SelfSeries:
    """metric -> target ("" for tuner's own, unlabelled series) -> points (ts_ms, value), oldest first."""

    def __init__(self, keep_s: float) -> None:
        self.keep_ms = int(keep_s * 1000)
        self._lock = threading.Lock()
        self._series: dict[str, dict[str, deque[Point]]] = {}

    def record(self, metric: str, target: str, ts_ms: int, value: float) -> None:
        with self._lock:
            pts = self._series.setdefault(metric, {}).setdefault(target, deque())
            if pts and ts_ms <= pts[-1][0]:  # a clock stepped back: keep the series in time order
                pts.clear()
            pts.append((ts_ms, float(value)))
            while pts and pts[0][0] < ts_ms - self.keep_ms:
                pts.popleft()

    def forget(self, metric: str, target: str) -> None:
        with self._lock:
            self._series.get(metric, {}).pop(target, None)

    def points(self, metric: str) -> SeriesByTarget:
        with self._lock:
            return {t: tuple(pts) for t, pts in self._series.get(metric, {}).items()}
