"""What the store hands to the signals stage: the stored points of one target over a time range."""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar, overload

from tuner.collect.snapshots import SeriesKey

__all__ = [
    "Point",
    "Points",
    "HistPoint",
    "HistPoints",
    "HistSeries",
    "EngineWindow",
    "TargetWindow",
    "TargetHealth",
    "GpuLatest",
]

Point = tuple[int, float]  # (ts_ms, value)


@dataclass(frozen=True)
class HistPoint:
    ts_ms: int
    counts: tuple[float, ...]  # cumulative, aligned with HistSeries.bounds
    sum: float
    count: float


_T = TypeVar("_T")
_R = TypeVar("_R", bound="_Rows")


class _Rows(Sequence[_T]):
    """What Points and HistPoints share: rows at ascending times ``ts`` (an array), read one by one or cut to a
    contiguous range (a copy)."""

    __slots__ = ()
    ts: array

    def __len__(self) -> int:
        return len(self.ts)

    @overload
    def __getitem__(self, i: int) -> _T: ...
    @overload
    def __getitem__(self: _R, i: slice) -> _R: ...  # noqa: E301

    def __getitem__(self, i):
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self.ts))
            if step != 1:
                raise ValueError(f"{type(self).__name__}: only contiguous slices")
            return self._cut(lo, hi)
        return self._row(i)

    def since(self: _R, start_ms: int) -> _R:
        return self._cut(bisect_left(self.ts, start_ms), len(self.ts))

    def _row(self, i: int) -> _T:
        raise NotImplementedError

    def _cut(self: _R, lo: int, hi: int) -> _R:
        """Rows lo..hi-1 (none when hi <= lo), as copies."""
        raise NotImplementedError


def _falls_within(falls: Iterable[tuple], ts: array) -> tuple:
    """The falls after the first of the times ``ts`` and up to the last."""
    return tuple(f for f in falls if ts[0] < f[0] <= ts[-1]) if ts else ()


class Points(_Rows[Point]):
    """A counter's or gauge's points as the store's in-memory head holds them (tuner/store/head.py): two arrays
    and the series' falls, so that a window's increase is worked out from its first and last points and its
    falls (tuner/signals/promql.py) instead of a pass over every point. A sequence of (ts_ms, value) like the
    tuple a read from SQLite gives, and read the same by everything else. Immutable (the arrays are copies)."""

    __slots__ = ("ts", "values", "falls")

    def __init__(self, ts: array, values: array, falls: Sequence[tuple[int, float]] = ()) -> None:
        self.ts = ts  # array('q'), ascending
        self.values = values  # array('d')
        # (ts of a point lower than the one before it, that one's value), for each such point after the first
        self.falls = falls

    def _row(self, i: int) -> Point:
        return self.ts[i], self.values[i]

    def __iter__(self) -> Iterator[Point]:
        return zip(self.ts, self.values)

    def __repr__(self) -> str:
        return f"Points({list(self)!r})"

    def _cut(self, lo: int, hi: int) -> Points:
        ts = self.ts[lo : max(lo, hi)]
        return Points(ts, self.values[lo : max(lo, hi)], _falls_within(self.falls, ts))


class HistPoints(_Rows[HistPoint]):
    """A histogram's rows as the in-memory head holds them: times, sums and counts as arrays, each row's bucket
    counts as stored (tuner/store/counts.py) one after another in one bytes object, decoded only when a row is
    read, and the rows where some bucket fell, so that a window's bucket increases decode its first and last rows
    and those only. A sequence of HistPoint like a read from SQLite gives. Immutable."""

    __slots__ = ("ts", "sums", "totals", "blob", "ends", "start", "falls", "_decode")

    def __init__(
        self,
        ts: array,
        sums: array,
        totals: array,
        blob: bytes | bytearray,
        ends: array,
        start: int,
        falls: Sequence[tuple[int, str, str]],
        decode: Callable[[str], tuple[float, ...]],
    ) -> None:
        self.ts = ts  # array('q'), ascending
        self.sums, self.totals = sums, totals  # array('d'): each row's sum and count
        # Row k's encoded counts are blob[ends[k-1] - start:ends[k] - start] (row 0's from 0): offsets as the head
        # numbers them, ``start`` where row 0 begins.
        self.blob, self.ends, self.start = blob, ends, start
        self.falls = falls  # (ts, counts before, counts at ts) for each row where some bucket fell, after the first
        self._decode = decode

    def _row(self, i: int) -> HistPoint:
        return HistPoint(self.ts[i], self.decode(self.text(i)), self.sums[i], self.totals[i])

    def __iter__(self) -> Iterator[HistPoint]:
        return (self[i] for i in range(len(self.ts)))

    def text(self, i: int) -> str:
        """Row ``i``'s bucket counts as stored."""
        if i < 0:
            i += len(self.ts)
        if not 0 <= i < len(self.ts):
            raise IndexError(i)
        a = self.ends[i - 1] if i else self.start
        return self.blob[a - self.start : self.ends[i] - self.start].decode("ascii")

    def decode(self, counts: str) -> tuple[float, ...]:
        return self._decode(counts)

    def _cut(self, lo: int, hi: int) -> HistPoints:
        hi = max(lo, hi)
        if hi == lo:
            return HistPoints(array("q"), array("d"), array("d"), b"", array("q"), 0, (), self._decode)
        start = self.ends[lo - 1] if lo else self.start
        ts = self.ts[lo:hi]
        return HistPoints(
            ts,
            self.sums[lo:hi],
            self.totals[lo:hi],
            bytes(self.blob[start - self.start : self.ends[hi - 1] - self.start]),
            self.ends[lo:hi],
            start,
            _falls_within(self.falls, ts),
            self._decode,
        )


@dataclass(frozen=True)
class HistSeries:
    bounds: tuple[float, ...]  # ascending upper bounds, last +Inf
    points: Sequence[HistPoint]  # ascending ts: a tuple, or HistPoints from the in-memory head


@dataclass(frozen=True)
class EngineWindow:
    engine: str
    model_name: str
    series: Mapping[SeriesKey, Sequence[Point]]  # counters and gauges, ascending ts: tuples, or Points (the head)
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

    def since(self, start_ms: int) -> TargetWindow:
        """The same window from ``start_ms`` on: the points a read of [start_ms, end_ms] gives when this window
        holds every stored point (a window within the raw retention); series and engines left with no point are
        left out, as such a read leaves them."""
        engines = []
        for e in self.engines:
            series = {}
            for key, pts in e.series.items():
                kept = pts.since(start_ms) if isinstance(pts, Points) else pts[bisect_left(pts, (start_ms,)) :]
                if kept:
                    series[key] = kept
            hists = {}
            for key, h in e.hists.items():
                if isinstance(h.points, HistPoints):
                    hpts: Sequence[HistPoint] = h.points.since(start_ms)
                else:
                    hpts = h.points[bisect_left(h.points, start_ms, key=lambda p: p.ts_ms) :]
                if hpts:
                    hists[key] = HistSeries(h.bounds, hpts)
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
