"""The store's in-memory head: the newest minutes of the series the daemon's signals read, kept beside SQLite so
that the alert rules' windows are not read back from disk at every evaluation (Prometheus keeps its head block in
memory for the same reason).

The store's one writer appends each committed scrape's points (Store.write); a target's head is filled from
SQLite the first time a window of it is asked for (Store.window), and from then on holds every stored point of
its series from ``held_from`` on (each metric's from its ``since``), so a window within that span reads the same
points from here as from SQLite (tests/store/test_head.py holds the two equal). Points are arrays, and each series
remembers where it fell (a counter reset, a histogram bucket lower than the row before), so a window's increase is
worked out from its first and last points and its falls (tuner/signals/promql.py): a histogram row is decoded only
when read.

Each metric is kept for the longest window asked of it (and a margin), not the target's longest: the alert rules'
10-minute windows read goodput's histograms and the process start time, so the other series are not kept 10 minutes
for nothing (bench/results/2026-11-25-*-whole-run.md: the head was most of the daemon's growth over its ingest).

What the head does not hold it does not answer: a window that starts before a metric's ``since`` is read from
SQLite and fills the head from there (up to MAX_SPAN_MS); a point older than the series' newest (a clock stepped back)
drops the target's head, to be filled again at its next window.
"""

from __future__ import annotations

import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from operator import lt

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
        return Points(self.ts, self.values, self.falls)[i:j] if i < j else None


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
            del self.ts[:i], self.sums[:i], self.totals[:i], self.ends[:i], self.blob[: start - self.base]
            self.base = start
            self.falls = [f for f in self.falls if f[0] >= before]

    def view(self, lo: int, hi: int) -> HistPoints | None:
        """The rows in [lo, hi], copied; None when there are none."""
        i, j = bisect_left(self.ts, lo), bisect_right(self.ts, hi)
        if i >= j:
            return None
        whole = HistPoints(
            self.ts, self.sums, self.totals, self.blob, self.ends, self.base, self.falls, self.decode
        )  # over the live arrays: cut copies
        return whole[i:j]


class _TargetHead:
    __slots__ = ("held_from", "trimmed", "spans", "series", "trim_at")

    def __init__(self, held_from: int, spans: dict[str, int]) -> None:
        self.held_from = held_from  # filled from here: every stored point of every series from here on is held...
        self.trimmed: dict[str, int] = {}  # ...but a metric's trimmed since: from here on for its series
        self.spans = spans  # metric -> the longest window asked of it: what trimming keeps (0: never asked)
        self.series: dict[int, _Plain | _Hist] = {}
        self.trim_at = held_from  # a scrape this new or newer may let some metric be trimmed

    def since(self, metric: str) -> int:
        """From when on every stored point of ``metric``'s series is held."""
        return self.trimmed.get(metric, self.held_from)

    def covers(self, lo: int, metrics: Collection[str] | None) -> bool:
        if lo < self.held_from:
            return False
        trimmed = self.trimmed
        return not trimmed or all(
            trimmed.get(m, self.held_from) <= lo for m in (trimmed if metrics is None else metrics)
        )

    def trim(self, newest: int) -> None:
        """Cut each metric's series to its span and a margin before ``newest``, in steps (not at every scrape)."""
        by_metric: dict[str, list[_Plain | _Hist]] = {}
        for s in self.series.values():
            by_metric.setdefault(s.info.metric, []).append(s)
        next_at = None
        for metric, series in by_metric.items():
            span, since = self.spans.get(metric, 0), self.since(metric)
            keep_from = newest - span - _MARGIN_MS
            if keep_from - since > _MARGIN_MS:
                for s in series:
                    s.cut(keep_from)
                self.trimmed[metric] = since = keep_from
            due = since + span + 2 * _MARGIN_MS + 1  # the newest point at which this metric is cut next
            next_at = due if next_at is None else min(next_at, due)
        self.trim_at = newest + _MARGIN_MS if next_at is None else next_at


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

    def covers(self, target: str, lo: int, metrics: Collection[str] | None = None) -> bool:
        """Whether the head holds every stored point of ``target``'s series of ``metrics`` (None: all it holds)
        from ``lo`` on."""
        with self._lock:
            held = self._targets.get(target)
            return held is not None and held.covers(lo, metrics)

    def fill(
        self,
        target: str,
        lo: int,
        span_ms: int,
        infos: Iterable[SeriesInfo],
        plain: Iterable[tuple[int, int, float]],
        hists: Iterable[tuple[int, int, float, float, str]],
        metrics: Collection[str] | None = None,
    ) -> None:
        """Hold ``target`` from ``lo`` on: its series (``infos``, of the head's metrics) and every stored point of
        them from ``lo`` on (rows as SQLite gives them, ascending per series), keeping ``metrics`` (None: all) for
        ``span_ms`` at least. The caller holds the store's write lock, so no scrape lands in between."""
        held = _TargetHead(lo, dict.fromkeys(self.metrics if metrics is None else metrics, span_ms))
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
            if old is not None:  # what was asked before is still asked: kept as long
                for metric, span in old.spans.items():
                    held.spans[metric] = max(span, held.spans.get(metric, 0))
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

    def append(
        self,
        plain: Sequence[tuple[int, int, float, int]],
        hists: Sequence[tuple[int, int, float, float, str, int]],
        raw_counts: Sequence[Sequence[float]],
    ) -> None:
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
                if held is not None and newest >= held.trim_at:
                    held.trim(newest)

    def window(
        self, target: str, lo: int, hi: int, metrics: Collection[str] | None
    ) -> list[tuple[SeriesInfo, Points | HistPoints]] | None:
        """Every held series of ``target`` (of ``metrics``) with points in [lo, hi], cut to them; None when the head
        does not hold the target from ``lo`` on."""
        out: list[tuple[SeriesInfo, Points | HistPoints]] = []
        with self._lock:
            held = self._targets.get(target)
            if held is None or not held.covers(lo, metrics):
                return None
            spans = held.spans
            for metric in self.metrics if metrics is None else metrics:
                if spans.get(metric, 0) < hi - lo:
                    spans[metric] = hi - lo  # kept as long from now on (trim_at may come early: trim() looks again)
            for s in held.series.values():
                if metrics is not None and s.info.metric not in metrics:
                    continue
                v = s.view(lo, hi)
                if v is not None:
                    out.append((s.info, v))
            self.served += 1
        return out

    def forget(self, series_ids: Collection[int]) -> None:
        """Series retention deleted from SQLite (no point of them is left there, nor here)."""
        with self._lock:
            for sid in series_ids:
                got = self._by_id.pop(sid, None)
                if got is not None:
                    held = self._targets.get(got[0])
                    if held is not None:
                        held.series.pop(sid, None)

    def clear(self) -> None:
        with self._lock:
            self._targets.clear()
            self._by_id.clear()

    def _drop(self, target: str) -> None:
        held = self._targets.pop(target, None)
        if held is not None:
            for sid in held.series:
                self._by_id.pop(sid, None)
