"""Signals once per tick per target: the daemon derives a target's signals over a window at most once per scrape
of it, and hands the same figures to everything that reads them in that tick: its /metrics exporter and the
status API (the default signal window) and the alert rules (each rule's window; rules over the default window
share the exporter's). A scrape of the target that the store wrote, successful or not, starts a new tick for
it; so does the scrape interval passing without one, so a window keeps sliding while scrapes are missed.

The advisor (auto mode, `tuner recommend`) reads the raw window beside the signals and derives its own: it runs
once per ``apply.auto_interval``, not per tick.
"""

from __future__ import annotations

import threading
from typing import Callable

from tuner.config import Config
from tuner.errors import UnknownTargetError
from tuner.signals.derive import SIGNAL_METRICS, TargetSignals, compute_signals
from tuner.store.store import Store

__all__ = ["SignalBook"]


class SignalBook:
    def __init__(self, cfg: Config, store: Store, *,
                 derive: Callable[..., TargetSignals] = compute_signals) -> None:
        self.cfg, self.store, self._derive = cfg, store, derive
        self._lock = threading.Lock()
        self._book: dict[tuple[str, float], tuple[int, float, TargetSignals | None]] = {}  # -> (tick, at, signals)
        self.derived = 0  # how many times signals were really derived (tests and bench read it)

    def get(self, name: str, window_s: float, now: float) -> TargetSignals | None:
        """The target's signals over the ``window_s`` before ``now``, derived once per tick; None when the target
        has never been scraped (no data, no signal). A store error propagates and nothing is kept."""
        target = self.cfg.target(name)
        interval = self.cfg.interval(target).total_seconds()
        key = (name, float(window_s))
        tick = self.store.scrapes(name)
        with self._lock:
            held = self._book.get(key)
            if held is not None and held[0] == tick and 0 <= now - held[1] < interval:
                return held[2]
        try:
            sig: TargetSignals | None = self._derive(
                self.store.window(name, now - window_s, now, metrics=SIGNAL_METRICS), slo=target.slo)
        except UnknownTargetError:
            sig = None  # never scraped yet
        with self._lock:
            self.derived += 1
            self._book[key] = (tick, now, sig)
        return sig
