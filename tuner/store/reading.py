"""Reading a target back from SQLite: its window (every point in a range, or a long range at the rollup step), the
points the head starts from, and its backend, engine configs and health. Each takes the driver's connection
(tuner/store/rows.py) and leaves transactions and errors to the Store that calls it."""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any, NamedTuple

from tuner.collect.snapshots import SeriesKey
from tuner.errors import UnknownTargetError
from tuner.store.counts import decode_counts
from tuner.store.head import MAX_SPAN_MS, SeriesInfo
from tuner.store.rows import bounds_parse, labels_parse
from tuner.store.window import EngineWindow, HistPoint, HistSeries, TargetHealth, TargetWindow

__all__ = ["MARKED_UNTIL", "SELECT_TARGET_SERIES", "Meta", "assemble", "head_points", "meta", "target_health", "window"]

SELECT_TARGET = "SELECT id, backend FROM targets WHERE name = ?"
SELECT_TARGET_SERIES = "SELECT id, engine, model_name, metric, labels, kind, bounds FROM series WHERE target_id = ?"
# One target's range of the key (target, time, series), its points in series order.
_SELECT_POINTS = (
    "SELECT series_id, %s FROM %s WHERE target_id = ? AND ts_ms >= ? AND ts_ms <= ? "
    "AND series_id IN (%s) ORDER BY series_id, ts_ms"
)
# A long window at the rollup step: the points retention marked to keep (tuner/store/retention.py), every point
# after the last marked step, and each series' last point within the window.
_SELECT_MARKED = (
    "SELECT series_id, %s FROM %s WHERE target_id = ? AND ts_ms >= ? AND ts_ms <= ? "
    "AND series_id IN (%s) AND (keep = 1 OR ts_ms >= ?) ORDER BY series_id, ts_ms"
)
_SELECT_LAST = (
    "SELECT series_id, MAX(ts_ms), %s FROM %s WHERE target_id = ? AND ts_ms >= ? AND ts_ms <= ? "
    "AND series_id IN (%s) GROUP BY series_id"
)
MARKED_UNTIL = "marked_until_ms"  # meta key: retention has marked every step before it
_SELECT_MARKED_UNTIL = f"SELECT value FROM meta WHERE key = '{MARKED_UNTIL}'"
_SELECT_CONFIGS = "SELECT engine, model_name, config FROM engine_configs WHERE target_id = ? ORDER BY last_seen_ms"
_SELECT_HEALTH = (
    "SELECT health, last_error, last_scrape_ms, last_success_ms, last_duration_s, consecutive_failures, "
    "server_healthy FROM target_health WHERE target_id = ?"
)
_FIRST = itemgetter(0)
_FOREVER_MS = 2**62

# A target's backend, its engine configs (the newest seen of each engine and model) and its health.
Meta = tuple[str, dict[tuple[str, str], dict], TargetHealth | None]


class _SeriesMeta(NamedTuple):
    id: int
    engine: str
    model_name: str
    metric: str
    labels: str  # JSON
    kind: str
    bounds: str  # JSON, "" for counters and gauges


def window(
    raw: sqlite3.Connection,
    target: str,
    lo: int,
    hi: int,
    *,
    metrics: Collection[str] | None,
    step: int | None,
    names: Callable[[], list[str]],
) -> TargetWindow:
    """Every stored point of ``target`` with lo <= ts <= hi, of the series named in ``metrics`` when given; at the
    rollup ``step`` (ms) when given: the points retention marked, every point after the last marked step, and the
    window's last point (Store.window says why). ``names``: the targets there are, for an unknown one's error."""
    trow = raw.execute(SELECT_TARGET, (target,)).fetchone()
    if trow is None:
        raise UnknownTargetError(target, names())
    tid, backend = trow
    by_id = {
        row[0]: _SeriesMeta(*row)
        for row in raw.execute(SELECT_TARGET_SERIES, (tid,))
        if metrics is None or row[3] in metrics
    }

    marked = 0
    if step is not None:
        row = raw.execute(_SELECT_MARKED_UNTIL).fetchone()
        marked = int(row[0]) if row else 0

    def points(table: str, cols: str, ids: list[int]) -> list[tuple]:
        marks = ",".join("?" * len(ids))
        if step is None or marked <= lo:
            return raw.execute(_SELECT_POINTS % (cols, table, marks), (tid, lo, hi, *ids)).fetchall()
        rows = raw.execute(_SELECT_MARKED % (cols, table, marks), (tid, lo, hi, *ids, marked)).fetchall()
        if hi >= marked:
            return rows
        # The last point of the window, where its step goes on after it (a marked step's last point).
        cols_last = cols.split(", ", 1)[1]
        last = {
            r[0]: r for r in raw.execute(_SELECT_LAST % (cols_last, table, marks), (tid, max(lo, hi - step), hi, *ids))
        }
        newest = {r[0]: r[1] for r in rows}
        extra = [r for sid, r in last.items() if r[1] > newest.get(sid, -1)]
        return sorted(rows + extra, key=lambda r: (r[0], r[1])) if extra else rows

    plain: dict[int, list[tuple[int, float]]] = {}
    hists: dict[int, list[HistPoint]] = {}
    ids = [sid for sid, m in by_id.items() if m.kind != "histogram"]
    for sid, rows in groupby(points("samples", "ts_ms, value", ids), key=_FIRST):
        plain[sid] = [(ts, v) for _, ts, v in rows]
    ids = [sid for sid, m in by_id.items() if m.kind == "histogram"]
    for sid, rows in groupby(points("hist_samples", "ts_ms, count, sum, counts", ids), key=_FIRST):
        n = len(bounds_parse(by_id[sid].bounds))
        hists[sid] = [HistPoint(ts, decode_counts(counts, n), total, count) for _, ts, count, total, counts in rows]
    configs, health_now = _configs_and_health(raw, tid)  # as of the same read
    return assemble(
        target,
        backend,
        lo,
        hi,
        health_now,
        configs,
        [
            ((s := by_id[sid]).engine, s.model_name, s.metric, labels_parse(s.labels), None, tuple(pts))
            for sid, pts in plain.items()
        ]
        + [
            (
                (s := by_id[sid]).engine,
                s.model_name,
                s.metric,
                labels_parse(s.labels),
                bounds_parse(s.bounds),
                tuple(hpts),
            )
            for sid, hpts in hists.items()
        ],
    )


def meta(raw: sqlite3.Connection, target: str, names: Callable[[], list[str]]) -> Meta:
    """``target``'s backend, configs and health as SQLite holds them."""
    trow = raw.execute(SELECT_TARGET, (target,)).fetchone()
    if trow is None:  # deleted since the head held it
        raise UnknownTargetError(target, names())
    tid, backend = trow
    return (backend, *_configs_and_health(raw, tid))


def target_health(raw: sqlite3.Connection, target: str) -> TargetHealth | None:
    trow = raw.execute(SELECT_TARGET, (target,)).fetchone()
    return None if trow is None else _health_of(raw.execute(_SELECT_HEALTH, (trow[0],)).fetchone())


def head_points(
    raw: sqlite3.Connection, target: str, lo: int, metrics: Collection[str]
) -> tuple[list[SeriesInfo], list[tuple], list[tuple]] | None:
    """``target``'s series named in ``metrics`` and their points from ``lo`` on, as the head takes them (Head.fill);
    None when the target is unknown or ``lo`` lies more than MAX_SPAN_MS before its last scrape."""
    trow = raw.execute(SELECT_TARGET, (target,)).fetchone()
    if trow is None:
        return None
    tid = trow[0]
    health_now = _health_of(raw.execute(_SELECT_HEALTH, (tid,)).fetchone())
    if health_now is not None and health_now.last_scrape_ms - lo > MAX_SPAN_MS:
        return None
    infos = [
        SeriesInfo(
            sid, engine, model, metric, labels_parse(labels), bounds_parse(bounds) if kind == "histogram" else None
        )
        for sid, engine, model, metric, labels, kind, bounds in raw.execute(SELECT_TARGET_SERIES, (tid,))
        if metric in metrics
    ]
    infos.sort(key=lambda i: i.id)
    ids = [i.id for i in infos if i.bounds is None]
    plain = raw.execute(
        _SELECT_POINTS % ("ts_ms, value", "samples", ",".join("?" * len(ids))), (tid, lo, _FOREVER_MS, *ids)
    ).fetchall()
    ids = [i.id for i in infos if i.bounds is not None]
    hists = raw.execute(
        _SELECT_POINTS % ("ts_ms, count, sum, counts", "hist_samples", ",".join("?" * len(ids))),
        (tid, lo, _FOREVER_MS, *ids),
    ).fetchall()
    return infos, plain, hists


def assemble(
    target: str,
    backend: str,
    lo: int,
    hi: int,
    health: TargetHealth | None,
    configs: Mapping[tuple[str, str], dict],
    series: Iterable[tuple],
) -> TargetWindow:
    """A window from its series, in series-id order: (engine, model, metric, labels, bounds or None for a counter
    or gauge, points)."""
    engines: dict[tuple[str, str], dict[str, dict]] = defaultdict(lambda: {"series": {}, "hists": {}})
    for engine, model, metric, labels, bounds, pts in series:
        key: SeriesKey = (metric, labels)
        if bounds is None:
            engines[(engine, model)]["series"][key] = pts
            continue
        slot = engines[(engine, model)]["hists"]
        # After a bucket-layout change keep the layout with the newest data.
        if key not in slot or slot[key].points[-1].ts_ms < pts[-1].ts_ms:
            slot[key] = HistSeries(bounds, pts)
    return TargetWindow(
        target=target,
        backend=backend,
        start_ms=lo,
        end_ms=hi,
        health=health,
        engines=tuple(
            EngineWindow(engine=k[0], model_name=k[1], series=v["series"], hists=v["hists"], config=configs.get(k, {}))
            for k, v in sorted(engines.items())
        ),
    )


def _configs_and_health(raw: sqlite3.Connection, tid: int) -> tuple[dict[tuple[str, str], dict], TargetHealth | None]:
    """A target's engine configs (the newest seen of each engine and model) and its health, as SQLite holds them."""
    configs = {(engine, model): json.loads(config) for engine, model, config in raw.execute(_SELECT_CONFIGS, (tid,))}
    return configs, _health_of(raw.execute(_SELECT_HEALTH, (tid,)).fetchone())


def _health_of(row: Sequence[Any] | None) -> TargetHealth | None:
    if row is None:
        return None
    health, last_error, last_scrape_ms, last_success_ms, last_duration_s, failures, healthy = row
    return TargetHealth(
        health=health,
        last_error=last_error,
        last_scrape_ms=last_scrape_ms,
        last_success_ms=last_success_ms,
        last_duration_s=last_duration_s,
        consecutive_failures=failures,
        server_healthy=None if healthy is None else bool(healthy),
    )
