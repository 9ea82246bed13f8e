"""Writing snapshots and reading windows back. One writer at a time (a lock); readers never wait (WAL)."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import groupby, repeat
from operator import itemgetter
from typing import Any, NamedTuple

from sqlalchemy import Engine, delete, func, insert, select, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from tuner.collect.snapshots import EngineSnapshot, GpuReading, SeriesKey, TargetSnapshot
from tuner.config import Retention
from tuner.errors import StoreError, UnknownTargetError
from tuner.store.counts import decode_counts, encode_counts
from tuner.store.db import Tx
from tuner.store.head import MAX_SPAN_MS, Head, SeriesInfo
from tuner.store.models import EngineConfigRow, GpuProcessRow, GpuSampleRow, ScrapeRow, TargetRow
from tuner.store.window import (
    EngineWindow,
    GpuLatest,
    HistPoint,
    HistPoints,
    HistSeries,
    Points,
    TargetHealth,
    TargetWindow,
)

__all__ = ["Store", "Scraped", "Failed"]


class _SeriesMeta(NamedTuple):
    id: int
    engine: str
    model_name: str
    metric: str
    labels: str  # JSON
    kind: str
    bounds: str  # JSON, "" for counters and gauges


@dataclass(frozen=True)
class Scraped:
    """A successful scrape to store, with the target's URL and labels as configured."""

    snap: TargetSnapshot
    url: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def target(self) -> str:
        return self.snap.target


@dataclass(frozen=True)
class Failed:
    """A scrape that produced nothing: recorded with its error, so health and history show it."""

    target: str
    backend: str
    url: str
    ts: float  # unix seconds
    duration_s: float
    error: str
    labels: dict[str, str] = field(default_factory=dict)
    healthy: bool | None = None  # /health's answer when it was asked and answered (llama-server: before /metrics)


# The per-scrape writes as the driver's SQL (SQLite, like the OR IGNOREs): prepared once by sqlite3 and
# run without SQLAlchemy's per-row parameter processing, which cost more than the writes. Columns as in
# models.py.
# A row as the head takes it (series id, ts, values...), its target last.
_INSERT_SAMPLES = "INSERT OR IGNORE INTO samples (series_id, ts_ms, value, target_id) VALUES (?, ?, ?, ?)"
_INSERT_HISTS = (
    "INSERT OR IGNORE INTO hist_samples (series_id, ts_ms, count, sum, counts, target_id) VALUES (?, ?, ?, ?, ?, ?)"
)
_INSERT_SCRAPE = (
    "INSERT INTO scrapes (target_id, ts_ms, duration_s, health, error, body_bytes, samples) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
# One statement instead of SELECT + INSERT/UPDATE: a failure counts up, anything else resets the count.
_UPSERT_HEALTH = """
    INSERT INTO target_health (target_id, health, last_error, last_scrape_ms, last_success_ms, last_duration_s,
                               consecutive_failures, server_healthy)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (target_id) DO UPDATE SET
        health = excluded.health, last_error = excluded.last_error, last_scrape_ms = excluded.last_scrape_ms,
        last_success_ms = COALESCE(excluded.last_success_ms, target_health.last_success_ms),
        last_duration_s = excluded.last_duration_s,
        -- /health not asked at this scrape (collect/vllm.py): the last answer stands; a down target has only what
        -- this scrape's /health answered (llama-server's answers while its /metrics hangs), if anything
        server_healthy = CASE WHEN excluded.health = 'down' THEN excluded.server_healthy
                              ELSE COALESCE(excluded.server_healthy, target_health.server_healthy) END,
        consecutive_failures = CASE WHEN excluded.health = 'down'
                                    THEN target_health.consecutive_failures + 1 ELSE 0 END"""
_INSERT_SERIES = (
    "INSERT OR IGNORE INTO series (target_id, engine, model_name, metric, labels, kind, bounds) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_SELECT_TARGET = "SELECT id, backend FROM targets WHERE name = ?"
_SELECT_TARGET_SERIES = "SELECT id, engine, model_name, metric, labels, kind, bounds FROM series WHERE target_id = ?"
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
_TOUCH_CONFIG = "UPDATE engine_configs SET last_seen_ms = ? WHERE id = ?"


def driver_connection(conn) -> sqlite3.Connection:
    """The sqlite3 connection under a SQLAlchemy one, for the per-scrape writes and the window reads."""
    raw = conn.connection.driver_connection
    assert isinstance(raw, sqlite3.Connection), "tuner's store is SQLite"
    return raw


def _ms(ts: float) -> int:
    return int(round(ts * 1000))


def _bounds_json(bounds: tuple[float, ...]) -> str:
    return json.dumps([b if b != float("inf") else "+Inf" for b in bounds])


@lru_cache(maxsize=65536)
@lru_cache(maxsize=4096)
def _bounds_parse(text: str) -> tuple[float, ...]:
    """A histogram's stored bounds (memoized: every target's histogram of a metric has the same ones, and the
    head holds one tuple for all of them, bench/results/)."""
    return tuple(float("inf") if b == "+Inf" else float(b) for b in json.loads(text))


@lru_cache(maxsize=65536)
def _labels_parse(text: str) -> tuple[tuple[str, str], ...]:
    """A series' stored labels as the window's key holds them (the same text is the same key: memoized, as every
    window read of every target parses the same few label sets)."""
    return tuple(tuple(p) for p in json.loads(text))


_FIRST = itemgetter(0)
_SELECT_HEALTH = (
    "SELECT health, last_error, last_scrape_ms, last_success_ms, last_duration_s, consecutive_failures, "
    "server_healthy FROM target_health WHERE target_id = ?"
)


_FOREVER_MS = 2**62


def _assemble(
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


@dataclass(frozen=True)
class _Shape:
    """One engine's series keys at its last scrape and their series ids, in the same order."""

    values: tuple
    hists: tuple
    bounds: tuple
    value_ids: list[int]
    hist_ids: list[int]


class Store:
    """The only module that writes SQL. Methods take snapshots in and give windows out."""

    def __init__(self, engine: Engine, *, retention: Retention | None = None) -> None:
        """``retention``: the config's; a window longer than its raw span is read at its rollup step (window())."""
        self.engine = engine
        self.retention = retention
        self._lock = threading.Lock()
        self._targets: dict[str, int] = {}
        self._series_by_key: dict[tuple, int] = {}  # (target, engine, model, metric, labels, bounds) as scraped
        self._configs: dict[tuple[int, str, str], tuple[int, dict[str, str]]] = {}  # -> (row id, config)
        # (target id, engine, model) -> its last scrape's series keys and their ids, in the snapshot's order: the
        # next scrape of the same shape (the learned layout fills the same keys each time) skips the key lookups
        self._shapes: dict[tuple[int, str, str], _Shape] = {}
        self._scrapes: dict[str, int] = {}  # target -> scrapes stored or recorded failed by this process
        self._head: Head | None = None
        self._new_infos: list[tuple[str, list[SeriesInfo]]] = []  # series the transaction in progress created
        # target -> (backend, configs, health) as SQLite holds them, for the windows the head answers: read once,
        # then kept by this Store's writes (_keep_meta), not read back at every window (3 queries and a pooled
        # connection: ~40% of a head window's cost at 1,000 targets, bench/results/2026-11-25-1619-whole-run.md)
        self._meta: dict[str, tuple[str, dict[tuple[str, str], dict], TargetHealth | None]] = {}

    def keep_head(self, metrics: Collection[str]) -> None:
        """Keep the newest points of the series named in ``metrics`` in memory (tuner/store/head.py): a window of
        those series only, within the raw retention, is then read from memory, after the first read of each
        target. The daemon's signal book asks for it; one-shot commands read SQLite."""
        self._head = Head(metrics)

    def scrapes(self, target: str) -> int:
        """How many scrapes of ``target`` this Store has written (a failed one too): a change means new data."""
        return self._scrapes.get(target, 0)

    # ---- writing -------------------------------------------------------------------------------

    def ensure_target(self, name: str, backend: str, url: str, labels: dict[str, str] | None = None) -> int:
        with self._lock, self.begin() as conn:
            return self._target_id(conn, name, backend, url, labels or {})

    def _target_id(self, conn, name: str, backend: str, url: str, labels: dict[str, str]) -> int:
        if name in self._targets:
            return self._targets[name]
        query = select(TargetRow.id, TargetRow.backend, TargetRow.url).where(TargetRow.name == name)
        row = conn.execute(query).first()
        if row is None:  # an upsert: another process may register the same name at the same instant
            conn.execute(
                sqlite_insert(TargetRow)
                .values(name=name, backend=backend, url=url, labels=json.dumps(labels))
                .on_conflict_do_nothing(index_elements=["name"])
            )
            row = conn.execute(query).one()
        tid = row.id
        if (row.backend, row.url) != (backend, url):
            conn.execute(
                update(TargetRow).where(TargetRow.id == tid).values(backend=backend, url=url, labels=json.dumps(labels))
            )
        self._targets[name] = tid
        return tid

    @property
    def lock(self) -> threading.Lock:
        """Held around every write transaction of this Store; the store's own modules that write beside it (alert
        state, retention) hold it too, with ``begin``."""
        return self._lock

    def begin(self) -> Tx:
        """A write transaction whose rollback drops the ids this Store cached (take ``lock`` around it)."""
        return Tx(self.engine, on_rollback=self._forget_ids)

    def _forget_ids(self) -> None:
        """A rolled-back transaction may have created ids we cached: drop the caches (the head's too)."""
        self._targets.clear()
        self._series_by_key.clear()
        self._configs.clear()
        self._shapes.clear()
        self._meta.clear()
        if self._head is not None:
            self._head.clear()

    def ingest(self, snap: TargetSnapshot, *, url: str = "", labels: dict[str, str] | None = None) -> int:
        """Store one successful scrape; returns the number of samples written."""
        return self.write([Scraped(snap, url, labels or {})])[0]

    def record_failure(
        self,
        target: str,
        backend: str,
        url: str,
        ts: float,
        duration_s: float,
        error: str,
        labels: dict[str, str] | None = None,
    ) -> None:
        """A scrape that produced nothing: recorded with its error, so health and history show it."""
        self.write([Failed(target, backend, url, ts, duration_s, error, labels or {})])

    def write(self, items: Sequence[Scraped | Failed]) -> list[int]:
        """Store scrapes and failures in one transaction (the daemon writes a tick's worth at once: one commit,
        and each statement run once for all rows); the samples written per item. All or nothing."""
        plain: list[tuple[int, int, float, int]] = []  # (series id, ts, value, target id)
        hist: list[tuple[int, int, float, float, str, int]] = []
        raw_counts: list[tuple[float, ...]] | None = [] if self._head is not None else None  # as scraped
        scrapes: list[tuple] = []
        healths: list[tuple] = []
        written: list[int] = []
        touches: list[tuple[int, int]] = []  # (ts, config row id): a config seen again
        with self._lock:
            self._new_infos = []
            self._write_rows(items, plain, hist, raw_counts, scrapes, healths, written, touches)
            if self._head is not None:  # committed: the head holds what SQLite holds
                for target, infos in self._new_infos:
                    self._head.new_series(target, infos)
                self._head.append(plain, hist, raw_counts or ())
            if self._meta:
                self._keep_meta(items, healths)
        for item in items:  # committed
            self._scrapes[item.target] = self._scrapes.get(item.target, 0) + 1
        return written

    def _keep_meta(self, items: Sequence[Scraped | Failed], healths: list[tuple]) -> None:
        """The committed batch's health rows and configs on the targets whose meta is kept: what _UPSERT_HEALTH and
        _config_seen made of them in SQLite (tests/store/test_head.py holds the two equal)."""
        for item, (_, health, error, ts, success, duration, failed, healthy) in zip(items, healths):
            kept = self._meta.get(item.target)
            if kept is None:
                continue
            backend, configs, prev = kept
            if prev is not None and ts < prev.last_scrape_ms:  # a clock stepped back: read it again when asked
                del self._meta[item.target]
                continue
            if health == "down":  # a down target has only what this scrape's /health answered, if anything
                server_healthy = None if healthy is None else bool(healthy)
            elif healthy is not None:  # /health asked at this scrape
                server_healthy = bool(healthy)
            else:  # not asked: the last answer stands
                server_healthy = None if prev is None else prev.server_healthy
            now = TargetHealth(
                health=health,
                last_error=error,
                last_scrape_ms=ts,
                last_success_ms=success if success is not None or prev is None else prev.last_success_ms,
                last_duration_s=duration,
                consecutive_failures=(prev.consecutive_failures + 1 if prev is not None else 1) if failed else 0,
                server_healthy=server_healthy,
            )
            if isinstance(item, Scraped) and any(e.config for e in item.snap.engines):
                configs = dict(configs)  # a window already handed out keeps its own
                for e in item.snap.engines:
                    if e.config:
                        configs[(e.engine, e.model_name)] = dict(sorted(e.config.items()))
            self._meta[item.target] = (backend, configs, now)

    def _write_rows(
        self,
        items: Sequence[Scraped | Failed],
        plain: list,
        hist: list,
        raw_counts: list | None,
        scrapes: list,
        healths: list,
        written: list,
        touches: list,
    ) -> None:
        with self.begin() as conn:
            try:
                for item in items:
                    if isinstance(item, Failed):
                        tid = self._target_id(conn, item.target, item.backend, item.url, item.labels)
                        ts = _ms(item.ts)
                        scrapes.append((tid, ts, item.duration_s, "down", item.error, 0, 0))
                        healths.append(
                            (
                                tid,
                                "down",
                                item.error,
                                ts,
                                None,
                                item.duration_s,
                                1,
                                None if item.healthy is None else int(item.healthy),
                            )
                        )
                        written.append(0)
                        continue
                    snap = item.snap
                    tid = self._target_id(conn, snap.target, snap.backend, item.url, item.labels)
                    n = self._rows(conn, tid, snap, plain, hist, raw_counts, touches)
                    ts = _ms(snap.ts)
                    health = "degraded" if snap.problems else "up"
                    error = "; ".join(snap.problems)
                    scrapes.append((tid, ts, snap.duration_s, health, error, snap.body_bytes, n))
                    healths.append(
                        (
                            tid,
                            health,
                            error,
                            ts,
                            ts,
                            snap.duration_s,
                            0,
                            None if snap.healthy is None else int(snap.healthy),
                        )
                    )
                    written.append(n)
                raw = driver_connection(conn)  # the driver's executemany: SQLAlchemy's own work costs more
                if plain:
                    raw.executemany(_INSERT_SAMPLES, plain)
                if hist:
                    raw.executemany(_INSERT_HISTS, hist)
                if scrapes:
                    raw.executemany(_INSERT_SCRAPE, scrapes)
                    raw.executemany(_UPSERT_HEALTH, healths)  # in order: a target twice in one batch counts up
                if touches:
                    raw.executemany(_TOUCH_CONFIG, touches)
            except sqlite3.DatabaseError as exc:  # locked, full, read-only: the whole batch rolls back
                raise StoreError(f"{self.engine.url}: {exc}") from None

    def _rows(
        self, conn, tid: int, snap: TargetSnapshot, plain: list, hist: list, raw_counts: list | None, touches: list
    ) -> int:
        """Append one scrape's sample rows; returns how many."""
        ts = _ms(snap.ts)
        n = 0
        for e in snap.engines:
            shape = self._shapes.get((tid, e.engine, e.model_name))
            values, hists = tuple(e.values), tuple(e.histograms)
            bounds = tuple(h.bounds for h in e.histograms.values())
            if shape is None or shape.values != values or shape.hists != hists or shape.bounds != bounds:
                shape = self._shape(conn, tid, snap, e, values, hists, bounds)
            plain.extend(zip(shape.value_ids, repeat(ts), e.values.values(), repeat(tid)))
            for sid, h in zip(shape.hist_ids, e.histograms.values()):
                hist.append((sid, ts, h.count, h.sum, encode_counts(h.counts), tid))
                if raw_counts is not None:
                    raw_counts.append(h.counts)
            n += len(values) + len(hists)
            if e.config:
                self._config_seen(conn, tid, e.engine, e.model_name, e.config, ts, touches)
        return n

    def _shape(
        self, conn, tid: int, snap: TargetSnapshot, e: EngineSnapshot, values: tuple, hists: tuple, bounds: tuple
    ) -> _Shape:
        """The series ids of one engine's keys (made to exist where new), remembered for its next scrape."""
        known = self._series_by_key
        keys = [(tid, e.engine, e.model_name, metric, lbl, None) for metric, lbl in values] + [
            (tid, e.engine, e.model_name, metric, lbl, b) for (metric, lbl), b in zip(hists, bounds)
        ]
        if any(k not in known for k in keys):
            known = self._new_series(conn, tid, snap)
        ids = [known[k] for k in keys]
        shape = self._shapes[(tid, e.engine, e.model_name)] = _Shape(
            values, hists, bounds, ids[: len(values)], ids[len(values) :]
        )
        return shape

    def _new_series(self, conn, tid: int, snap: TargetSnapshot) -> dict[tuple, int]:
        """Every series of ``snap`` made to exist in two statements (a target's first scrape has dozens)."""
        rows: list[tuple] = []
        keys: list[tuple] = []
        for e in snap.engines:
            for metric, lbl in e.values:
                kind = "counter" if metric.endswith("_total") else "gauge"
                rows.append((tid, e.engine, e.model_name, metric, json.dumps(lbl), kind, ""))
                keys.append((tid, e.engine, e.model_name, metric, lbl, None))
            for (metric, lbl), h in e.histograms.items():
                rows.append((tid, e.engine, e.model_name, metric, json.dumps(lbl), "histogram", _bounds_json(h.bounds)))
                keys.append((tid, e.engine, e.model_name, metric, lbl, h.bounds))
        raw = driver_connection(conn)
        raw.executemany(_INSERT_SERIES, rows)
        ids = {(r[1], r[2], r[3], r[4], r[6]): r[0] for r in raw.execute(_SELECT_TARGET_SERIES, (tid,))}
        infos = []
        for row, key in zip(rows, keys):
            sid = self._series_by_key[key] = ids[(row[1], row[2], row[3], row[4], row[6])]
            if self._head is not None and row[3] in self._head.metrics:
                infos.append(
                    SeriesInfo(
                        sid,
                        row[1],
                        row[2],
                        row[3],
                        _labels_parse(row[4]),
                        _bounds_parse(row[6]) if row[5] == "histogram" else None,
                    )
                )
        if infos:
            self._new_infos.append((snap.target, infos))
        return self._series_by_key

    def _config_seen(
        self,
        conn,
        tid: int,
        engine: str,
        model: str,
        config: Mapping[str, str],
        ts: int,
        touches: list[tuple[int, int]],
    ) -> None:
        """The engine's config as of ``ts``: the same as last seen is a touch of its row (``touches``, written with
        the batch), a new one a new row."""
        key = (tid, engine, model)
        cached = self._configs.get(key)
        if cached is None:
            row = conn.execute(
                select(EngineConfigRow.id, EngineConfigRow.config)
                .where(
                    EngineConfigRow.target_id == tid,
                    EngineConfigRow.engine == engine,
                    EngineConfigRow.model_name == model,
                )
                .order_by(EngineConfigRow.last_seen_ms.desc())
                .limit(1)
            ).first()
            cached = (row.id, json.loads(row.config)) if row else None
        if cached is not None and cached[1] == config:
            touches.append((ts, cached[0]))
            self._configs[key] = cached
            return
        rid = conn.execute(
            insert(EngineConfigRow).values(
                target_id=tid,
                engine=engine,
                model_name=model,
                first_seen_ms=ts,
                last_seen_ms=ts,
                config=json.dumps(dict(config), sort_keys=True),
            )
        ).inserted_primary_key[0]
        self._configs[key] = (rid, dict(config))

    def ingest_gpu(self, reading: GpuReading) -> int:
        if not reading.available:
            return 0
        ts = _ms(reading.ts)
        with self._lock, self.begin() as conn:
            rows = [
                dict(
                    ts_ms=ts,
                    source=reading.source,
                    gpu_index=g.index,
                    uuid=g.uuid,
                    name=g.name,
                    utilization=g.utilization,
                    memory_used_bytes=g.memory_used_bytes,
                    memory_total_bytes=g.memory_total_bytes,
                    temperature_c=g.temperature_c,
                    power_w=g.power_w,
                )
                for g in reading.gpus
            ]
            procs = [
                dict(ts_ms=ts, uuid=g.uuid, pid=p.pid, name=p.name, used_memory_bytes=p.used_memory_bytes)
                for g in reading.gpus
                for p in g.processes
            ]
            if rows:
                conn.execute(insert(GpuSampleRow), rows)
            if procs:
                conn.execute(insert(GpuProcessRow), procs)
            return len(rows)

    # ---- reading -------------------------------------------------------------------------------

    def data_span(self, target: str, start: float, end: float) -> tuple[float, float] | None:
        """(first, last) unix seconds of the target's scrapes that stored samples within [start, end]; None if none."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(func.min(ScrapeRow.ts_ms), func.max(ScrapeRow.ts_ms))
                .join(TargetRow, TargetRow.id == ScrapeRow.target_id)
                .where(
                    TargetRow.name == target,
                    ScrapeRow.samples > 0,
                    ScrapeRow.ts_ms >= _ms(start),
                    ScrapeRow.ts_ms <= _ms(end),
                )
            ).first()
        if row is None or row[0] is None:
            return None
        return row[0] / 1000, row[1] / 1000

    def target_names(self) -> list[str]:
        with self.engine.connect() as conn:
            return list(conn.execute(select(TargetRow.name).order_by(TargetRow.name)).scalars())

    def health(self, target: str) -> TargetHealth | None:
        with self.engine.connect() as conn:
            raw = driver_connection(conn)
            trow = raw.execute(_SELECT_TARGET, (target,)).fetchone()
            return None if trow is None else _health_of(raw.execute(_SELECT_HEALTH, (trow[0],)).fetchone())

    def reads_every_point(self, span_s: float) -> bool:
        """Whether a window of ``span_s`` seconds reads every stored point (within the raw retention), so a shorter
        window is that window cut down (TargetWindow.since); a longer one reads at the rollup step."""
        return self.retention is None or span_s <= self.retention.raw.total_seconds()

    def window(self, target: str, start: float, end: float, *, metrics: Collection[str] | None = None) -> TargetWindow:
        """Every stored point of ``target`` with start <= ts <= end (Prometheus's range selection); of the series
        named in ``metrics`` only, when given.

        A window longer than the raw retention is read at the rollup step: the points retention marked to keep
        (of each series the last point of each step, and both points around each counter or histogram reset),
        every point after the last marked step, and the window's last point. Its older days hold only those
        points already, so this is the answer the same query gives once the newest days are thinned too, at a
        cost of steps instead of scrapes (a 30-day window: bench/results/)."""
        lo, hi = _ms(start), _ms(end)
        step = None
        if self.retention is not None and not self.reads_every_point(end - start):
            step = max(1, int(self.retention.rollup_step.total_seconds() * 1000))
        head = self._head
        if head is not None and step is None and metrics is not None and head.metrics.issuperset(metrics):
            if not head.covers(target, lo, metrics):
                self._fill_head(head, target, lo, hi, metrics)
            got = head.window(target, lo, hi, metrics)
            if got is not None:
                return self._head_window(target, lo, hi, got)
        # The driver's own cursor: a window is thousands of rows, and SQLAlchemy's per-row work cost more
        # than SQLite's (bench/results/).
        with self.engine.connect() as conn:
            raw = driver_connection(conn)
            try:
                trow = raw.execute(_SELECT_TARGET, (target,)).fetchone()
                if trow is None:
                    raise UnknownTargetError(target, self.target_names())
                tid, backend = trow
                by_id = {
                    row[0]: _SeriesMeta(*row)
                    for row in raw.execute(_SELECT_TARGET_SERIES, (tid,))
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
                        r[0]: r
                        for r in raw.execute(
                            _SELECT_LAST % (cols_last, table, marks), (tid, max(lo, hi - step), hi, *ids)
                        )
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
                    n = len(_bounds_parse(by_id[sid].bounds))
                    hists[sid] = [
                        HistPoint(ts, decode_counts(counts, n), total, count) for _, ts, count, total, counts in rows
                    ]
                configs, health = _configs_and_health(raw, tid)  # as of the same read
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"{self.engine.url}: {exc}") from None
        return _assemble(
            target,
            backend,
            lo,
            hi,
            health,
            configs,
            [
                ((s := by_id[sid]).engine, s.model_name, s.metric, _labels_parse(s.labels), None, tuple(pts))
                for sid, pts in plain.items()
            ]
            + [
                (
                    (s := by_id[sid]).engine,
                    s.model_name,
                    s.metric,
                    _labels_parse(s.labels),
                    _bounds_parse(s.bounds),
                    tuple(hpts),
                )
                for sid, hpts in hists.items()
            ],
        )

    def _head_window(
        self, target: str, lo: int, hi: int, got: list[tuple[SeriesInfo, Points | HistPoints]]
    ) -> TargetWindow:
        """The window from the head's points, with the target's backend, health and configs (read from SQLite
        the first time, then kept by the writes: _keep_meta)."""
        kept = self._meta.get(target)
        if kept is None:
            with self._lock, self.engine.connect() as conn:  # no write lands between the read and keeping it
                raw = driver_connection(conn)
                try:
                    trow = raw.execute(_SELECT_TARGET, (target,)).fetchone()
                    if trow is None:  # deleted since the head held it
                        raise UnknownTargetError(target, self.target_names())
                    tid, backend = trow
                    configs, health = _configs_and_health(raw, tid)
                except sqlite3.DatabaseError as exc:
                    raise StoreError(f"{self.engine.url}: {exc}") from None
                kept = self._meta[target] = (backend, configs, health)
        backend, configs, health = kept
        got.sort(key=lambda g: g[0].id)  # the order a read from SQLite gives (series id)
        return _assemble(
            target,
            backend,
            lo,
            hi,
            health,
            configs,
            [(i.engine, i.model_name, i.metric, i.labels, i.bounds, pts) for i, pts in got],
        )

    def _fill_head(self, head: Head, target: str, lo: int, hi: int, metrics: Collection[str] | None = None) -> None:
        """Give the head ``target``'s points from ``lo`` on, when that is at most MAX_SPAN_MS before its last
        scrape (a window far in the past is read from SQLite and left there). Under the write lock: no scrape
        lands between the read and the head taking it."""
        if hi - lo > MAX_SPAN_MS:
            return
        with self._lock, self.engine.connect() as conn:
            raw = driver_connection(conn)
            try:
                trow = raw.execute(_SELECT_TARGET, (target,)).fetchone()
                if trow is None:
                    return
                tid = trow[0]
                health = _health_of(raw.execute(_SELECT_HEALTH, (tid,)).fetchone())
                if health is not None and health.last_scrape_ms - lo > MAX_SPAN_MS:
                    return
                infos = [
                    SeriesInfo(
                        sid,
                        engine,
                        model,
                        metric,
                        _labels_parse(labels),
                        _bounds_parse(bounds) if kind == "histogram" else None,
                    )
                    for sid, engine, model, metric, labels, kind, bounds in raw.execute(_SELECT_TARGET_SERIES, (tid,))
                    if metric in head.metrics
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
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"{self.engine.url}: {exc}") from None
            head.fill(target, lo, hi - lo, infos, plain, hists, metrics)

    def gpu_latest(self, max_age_s: float, now: float) -> list[GpuLatest]:
        with self.engine.connect() as conn:
            last = conn.execute(select(GpuSampleRow.ts_ms).order_by(GpuSampleRow.ts_ms.desc()).limit(1)).scalar()
            if last is None or last < _ms(now - max_age_s):
                return []
            rows = conn.execute(
                select(GpuSampleRow).where(GpuSampleRow.ts_ms == last).order_by(GpuSampleRow.gpu_index)
            ).all()
            procs = conn.execute(select(GpuProcessRow).where(GpuProcessRow.ts_ms == last)).all()
        return [
            GpuLatest(
                ts_ms=r.ts_ms,
                index=r.gpu_index,
                uuid=r.uuid,
                name=r.name,
                utilization=r.utilization,
                memory_used_bytes=r.memory_used_bytes,
                memory_total_bytes=r.memory_total_bytes,
                temperature_c=r.temperature_c,
                power_w=r.power_w,
                processes=tuple((p.pid, p.name, p.used_memory_bytes) for p in procs if p.uuid == r.uuid),
            )
            for r in rows
        ]

    def forget_deleted(self, series_ids: Collection[int], config_ids: Collection[int]) -> None:
        """Retention deleted these series and engine-config rows: drop every id cached for them (a scrape of the same
        labels later makes new rows), so labels that churn do not grow the caches either. Called under the write
        lock, after the deletion committed."""
        if series_ids:
            gone = set(series_ids)
            for key in [k for k, sid in self._series_by_key.items() if sid in gone]:
                del self._series_by_key[key]
            for key in [
                k
                for k, sh in self._shapes.items()
                if not (gone.isdisjoint(sh.value_ids) and gone.isdisjoint(sh.hist_ids))
            ]:
                del self._shapes[key]
            if self._head is not None:
                self._head.forget(gone)
        if config_ids:
            gone = set(config_ids)
            for key in [k for k, (rid, _) in self._configs.items() if rid in gone]:
                del self._configs[key]
            self._meta.clear()  # each target's configs are read again at its next window

    def delete_targets_except(self, keep: Iterable[str]) -> None:
        """Not used by the daemon (history is kept when a target leaves the config); for tests/tools."""
        with self._lock, self.begin() as conn:
            conn.execute(delete(TargetRow).where(TargetRow.name.not_in(list(keep))))
            self._forget_ids()
