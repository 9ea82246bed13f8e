"""The store's in-memory head: the newest minutes of the series the daemon's signals read, kept beside SQLite so
that the alert rules' windows are not read back from disk at every evaluation (Prometheus keeps its head block in
memory for the same reason).

The store's one writer appends each committed scrape's points (Store.write); a target's head is filled from
SQLite the first time a window of it is asked for (Store.window), and from then on holds every stored point of
its series from ``held_from`` on, so a window within that span reads the same points from here as from SQLite
(tests/store/test_head.py holds the two equal). Points are arrays, and each series remembers where it fell (a
counter reset, a histogram bucket lower than the row before), so a window's increase is worked out from its
first and last points and its falls (tuner/signals/promql.py): a histogram row is decoded only when read.

What the head does not hold it does not answer: a window that starts before ``held_from`` is read from SQLite
and fills the head from there (up to MAX_SPAN_MS); a point older than the series' newest (a clock stepped back)
drops the target's head, to be filled again at its next window.
"""

from __future__ import annotations

import threading
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import partial
from operator import lt
from typing import Callable, Collection, Iterable, Sequence

from tuner.collect.snapshots import Labels
from tuner.store.counts import decode_counts
from tuner.store.window import HistPoints, Points

__all__ = ["Head", "SeriesInfo", "MAX_SPAN_MS"]

MAX_SPAN_MS = 3_600_000  # the longest window the head fills itself for (longer ones are read from SQLite)
_MARGIN_MS = 15_000  # kept beyond a target's longest window (a scrape's time may pass the evaluation's clock)


@dataclass(frozen=True)
class SeriesInfo:
    """A stored series as a window keys it."""

    id: int
    engine: str
    model_name: str
    metric: str
    labels: Labels
    bounds: tuple[float, ...] | None  # a histogram's; None for a counter or a gauge


class _Plain:
    __slots__ = ("info", "ts", "values", "falls")

    def __init__(self, info: SeriesInfo) -> None:
        self.info = info
        self.ts = array("q")
        self.values = array("d")
        self.falls: list[tuple[int, float]] = []

    def add(self, ts: int, value: float) -> bool:
        """False when the point is older than the newest (the head no longer holds every point)."""
        if self.ts:
            last = self.ts[-1]
            if ts <= last:
                return ts == last  # the store kept the first point of a time (INSERT OR IGNORE)
            if value < self.values[-1]:
                self.falls.append((ts, self.values[-1]))
        self.ts.append(ts)
        self.values.append(value)
        return True

    def cut(self, before: int) -> None:
        i = bisect_left(self.ts, before)
        if i:
            del self.ts[:i], self.values[:i]
            self.falls = [f for f in self.falls if f[0] >= before]

    def view(self, lo: int, hi: int) -> Points | None:
        """The points in [lo, hi], copied; None when there are none."""
        i, j = bisect_left(self.ts, lo), bisect_right(self.ts, hi)
        # a view over the live arrays, cut: the cut copies
        return Points(self.ts, self.values, self.falls)._cut(i, j) if i < j else None


class _Hist:
    __slots__ = ("info", "ts", "sums", "totals", "blob", "ends", "base", "falls", "last", "last_text", "decode")

    def __init__(self, info: SeriesInfo) -> None:
        assert info.bounds is not None
        self.info = info
        self.ts = array("q")
        self.sums = array("d")
        self.totals = array("d")
        # Each row's encoded counts, one after another (~20 bytes a row where a str would take ~70): row k ends at
        # ends[k] - base, and starts where row k - 1 ends (row 0 at 0).
        self.blob = bytearray()
        self.ends = array("q")
        self.base = 0
        self.falls: list[tuple[int, str, str]] = []
        self.last: Sequence[float] = ()  # the newest row's bucket counts, and as stored
        self.last_text = ""
        self.decode: Callable[[str], tuple[float, ...]] = partial(decode_counts, n=len(info.bounds))

    def add(self, ts: int, count: float, total: float, counts: str, raw: Sequence[float] | None = None) -> bool:
        if raw is None:
            raw = self.decode(counts)
        if self.ts:
            last = self.ts[-1]
            if ts <= last:
                return ts == last
            if any(map(lt, raw, self.last)):
                self.falls.append((ts, self.last_text, counts))
        self.ts.append(ts)
        self.totals.append(count)
        self.sums.append(total)
        self.blob += counts.encode("ascii")
        self.ends.append(self.base + len(self.blob))
        self.last, self.last_text = raw, counts
        return True

    def cut(self, before: int) -> None:
        i = bisect_left(self.ts, before)
        if i:
            start = self.ends[i - 1]
            del self.ts[:i], self.sums[:i], self.totals[:i], self.ends[:i], self.blob[:start - self.base]
            self.base = start
            self.falls = [f for f in self.falls if f[0] >= before]

    def view(self, lo: int, hi: int) -> HistPoints | None:
        """The rows in [lo, hi], copied; None when there are none."""
        i, j = bisect_left(self.ts, lo), bisect_right(self.ts, hi)
        if i >= j:
            return None
        whole = HistPoints(self.ts, self.sums, self.totals, self.blob, self.ends, self.base,
                           self.falls, self.decode)  # over the live arrays: cut copies
        return whole._cut(i, j)


class _TargetHead:
    __slots__ = ("held_from", "span_ms", "series")

    def __init__(self, held_from: int, span_ms: int) -> None:
        self.held_from = held_from  # every stored point of the series from here on is held
        self.span_ms = span_ms  # the longest window asked for: what trimming keeps
        self.series: dict[int, _Plain | _Hist] = {}


class Head:
    """The head of the series named in ``metrics``, per target. Thread-safe: the store's writer appends while the
    daemon's jobs read windows."""

    def __init__(self, metrics: Collection[str]) -> None:
        self.metrics = frozenset(metrics)
        self._lock = threading.Lock()
        self._targets: dict[str, _TargetHead] = {}
        self._by_id: dict[int, tuple[str, _Plain | _Hist]] = {}  # series id -> (target, series), held targets only
        self.fills = 0  # targets filled from SQLite (tests and the bench read these)
        self.served = 0  # windows answered from memory

    def covers(self, target: str, lo: int) -> bool:
        with self._lock:
            held = self._targets.get(target)
            return held is not None and lo >= held.held_from

    def fill(self, target: str, lo: int, span_ms: int, infos: Iterable[SeriesInfo],
             plain: Iterable[tuple[int, int, float]], hists: Iterable[tuple[int, int, float, float, str]]) -> None:
        """Hold ``target`` from ``lo`` on: its series (``infos``, of the head's metrics) and every stored point of
        them from ``lo`` on (rows as SQLite gives them, ascending per series). The caller holds the store's write
        lock, so no scrape lands in between."""
        held = _TargetHead(lo, span_ms)
        for info in infos:
            held.series[info.id] = _Hist(info) if info.bounds is not None else _Plain(info)
        for sid, ts, value in plain:
            s = held.series.get(sid)
            if isinstance(s, _Plain):
                s.add(ts, value)
        for sid, ts, count, total, counts in hists:
            s = held.series.get(sid)
            if isinstance(s, _Hist):
                s.add(ts, count, total, counts)
        with self._lock:
            old = self._targets.get(target)
            if old is not None:
                held.span_ms = max(held.span_ms, old.span_ms)
            self._drop(target)
            self._targets[target] = held
            self.fills += 1
            for sid, s in held.series.items():
                self._by_id[sid] = (target, s)

    def new_series(self, target: str, infos: Iterable[SeriesInfo]) -> None:
        """Series created for ``target`` by a committed write: held from now on when the target is."""
        with self._lock:
            held = self._targets.get(target)
            if held is None:
                return
            for info in infos:
                if info.metric in self.metrics and info.id not in held.series:
                    s = _Hist(info) if info.bounds is not None else _Plain(info)
                    held.series[info.id] = s
                    self._by_id[info.id] = (target, s)

    def append(self, plain: Sequence[tuple[int, int, float, int]],
               hists: Sequence[tuple[int, int, float, float, str, int]], raw_counts: Sequence[Sequence[float]]) -> None:
        """A committed write's rows (Store.write's lists, each row's target id last; ``raw_counts``: each histogram
        row's counts as scraped)."""
        by_id = self._by_id
        touched: dict[str, int] = {}  # target -> newest ts appended
        lost: set[str] = set()
        with self._lock:
            for sid, ts, value, _ in plain:
                got = by_id.get(sid)
                if got is not None and isinstance(s := got[1], _Plain):
                    if not s.add(ts, value):
                        lost.add(got[0])
                    elif ts > touched.get(got[0], -1):
                        touched[got[0]] = ts
            for (sid, ts, count, total, counts, _), raw in zip(hists, raw_counts):
                got = by_id.get(sid)
                if got is not None and isinstance(h := got[1], _Hist):
                    if not h.add(ts, count, total, counts, raw):
                        lost.add(got[0])
                    elif ts > touched.get(got[0], -1):
                        touched[got[0]] = ts
            for target in lost:
                self._drop(target)
            for target, newest in touched.items():
                held = self._targets.get(target)
                if held is None:
                    continue
                keep_from = newest - held.span_ms - _MARGIN_MS
                if keep_from - held.held_from > _MARGIN_MS:  # trim in steps, not at every scrape
                    for s in held.series.values():
                        s.cut(keep_from)
                    held.held_from = keep_from

    def window(self, target: str, lo: int, hi: int, metrics: Collection[str] | None
               ) -> list[tuple[SeriesInfo, Points | HistPoints]] | None:
        """Every held series of ``target`` (of ``metrics``) with points in [lo, hi], cut to them; None when the head
        does not hold the target from ``lo`` on."""
        out: list[tuple[SeriesInfo, Points | HistPoints]] = []
        with self._lock:
            held = self._targets.get(target)
            if held is None or lo < held.held_from:
                return None
            held.span_ms = max(held.span_ms, hi - lo)
            for s in held.series.values():
                if metrics is not None and s.info.metric not in metrics:
                    continue
                v = s.view(lo, hi)
                if v is not None:
                    out.append((s.info, v))
            self.served += 1
        return out

    def clear(self) -> None:
        with self._lock:
            self._targets.clear()
            self._by_id.clear()

    def _drop(self, target: str) -> None:
        held = self._targets.pop(target, None)
        if held is not None:
            for sid in held.series:
                self._by_id.pop(sid, None)
