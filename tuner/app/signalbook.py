"""Signals once per tick per target: the daemon derives a target's signals over a window at most once per scrape
of it, and hands the same figures to everything that reads them in that tick: its /metrics exporter and the
status API (the default signal window) and the alert rules (each rule's window; rules over the default window
share the exporter's). A scrape of the target that the store wrote, successful or not, starts a new tick for
it; so does the scrape interval passing without one, so a window keeps sliding while scrapes are missed.

The store keeps the newest points of the series signals read in memory (tuner/store/head.py), so after a
target's first window its windows come from there, not from SQLite.

The advisor (auto mode, `tuner recommend`) reads the raw window beside the signals and derives its own: it runs
once per ``apply.auto_interval``, not per tick.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping

from tuner.config import Config
from tuner.errors import UnknownTargetError
from tuner.signals.derive import ALWAYS_DERIVED, SIGNAL_METRICS, TargetSignals, compute_signals, metrics_for
from tuner.store.store import Store
from tuner.store.window import TargetWindow

__all__ = ["SignalBook"]


class SignalBook:
    def __init__(self, cfg: Config, store: Store, *, derive: Callable[..., TargetSignals] = compute_signals) -> None:
        self.cfg, self.store, self._derive = cfg, store, derive
        store.keep_head(SIGNAL_METRICS)  # the rules' windows from memory, not re-read from SQLite each evaluation
        self._lock = threading.Lock()
        # (target, window) -> (tick, at, signals, the fields derived: None for all of them)
        self._book: dict[tuple[str, float], tuple[int, float, TargetSignals | None, frozenset[str] | None]] = {}
        self.derived = 0  # how many times signals were really derived (tests and bench read it)
        self.reads = 0  # how many windows were read from the store for them

    def get(
        self,
        name: str,
        window_s: float,
        now: float,
        *,
        windows: Collection[float] = (),
        fields: Mapping[float, Collection[str]] | None = None,
    ) -> TargetSignals | None:
        """The target's signals over the ``window_s`` before ``now``, derived once per tick; None when the target
        has never been scraped (no data, no signal). A store error propagates and nothing is kept.

        ``windows``: other windows the caller will ask for in this tick (an alert group's rules). They are derived
        now, each from the read of the longest window that holds its series, cut down to it (TargetWindow.since):
        one read of the store per target and set of series instead of one per window, when the longest holds every
        stored point (within the raw retention).

        ``fields``: for a window, the only EngineSignals fields the caller reads (compute_signals's ``only``); the
        others are left None, and the window is read for the series those fields read only (metrics_for), so the
        store's head keeps no series longer than a reader wants it (its ``samples`` counts those series' points).
        The daemon's signal window is always derived whole: the exporter reads all of it."""
        target = self.cfg.target(name)
        interval = self.cfg.interval(target).total_seconds()
        whole = self.cfg.defaults.signal_window.total_seconds()

        def wanted(w: float) -> frozenset[str] | None:  # beyond what every derivation has
            got = (fields or {}).get(w)
            return None if got is None or w == whole else frozenset(got) - ALWAYS_DERIVED

        def this_tick(held: tuple | None) -> bool:
            return held is not None and held[0] == tick and 0 <= now - held[1] < interval

        key = (name, float(window_s))
        tick = self.store.scrapes(name)
        need: dict[float, frozenset[str] | None] = {}  # window -> the fields to derive (None: all)
        with self._lock:
            for w in {float(window_s), *map(float, windows)}:
                held, want = self._book.get((name, w)), wanted(w)
                if held is None or not this_tick(held):
                    need[w] = want
                elif held[3] is not None and (want is None or not want <= held[3]):  # short of what is asked
                    need[w] = None if want is None else want | held[3]  # and what the last reader wanted
            if float(window_s) not in need:
                return self._book[key][2]
            spans = set(need)
        longest = max(spans)
        if not self.store.reads_every_point(longest):
            spans = {float(window_s)}
            longest = float(window_s)
        derived: dict[float, TargetSignals | None] = {}
        reads: list[tuple[frozenset[str], float, TargetWindow]] = []  # (series, window, what was read), longest first
        try:
            for w in sorted(spans, reverse=True):
                only = need.get(w)
                metrics = metrics_for(only)
                got = next(((span, raw) for held, span, raw in reads if metrics <= held), None)
                if got is None:
                    got = (w, self.store.window(name, now - w, now, metrics=metrics))
                    reads.append((metrics, *got))
                cut = got[1] if w == got[0] else got[1].since(int(round((now - w) * 1000)))
                derived[w] = (
                    self._derive(cut, slo=target.slo) if only is None else self._derive(cut, slo=target.slo, only=only)
                )
        except UnknownTargetError:
            derived = dict.fromkeys(spans)  # never scraped yet
        with self._lock:
            self.derived += len(derived)
            self.reads += len(reads)
            for w, sig in derived.items():
                self._book[(name, w)] = (tick, now, sig, need.get(w))
        return derived[float(window_s)]
