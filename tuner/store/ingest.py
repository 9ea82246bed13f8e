"""Writing a batch of scrapes: snapshots in, rows out, through the driver's executemany (one statement for all the
batch's rows), with the ids the rows need cached (a target's next scrape of the same shape skips every lookup).
Store.write runs it under its write lock, in its transaction."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat

from sqlalchemy import insert, select, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from tuner.collect.snapshots import EngineSnapshot, TargetSnapshot
from tuner.errors import StoreError
from tuner.store.counts import encode_counts
from tuner.store.head import Head, SeriesInfo
from tuner.store.models import EngineConfigRow, TargetRow
from tuner.store.reading import SELECT_TARGET_SERIES
from tuner.store.rows import bounds_json, bounds_parse, driver_connection, labels_parse, ms
from tuner.store.window import TargetHealth

__all__ = ["Scraped", "Failed", "Batch", "Ingest", "health_after"]


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
_TOUCH_CONFIG = "UPDATE engine_configs SET last_seen_ms = ? WHERE id = ?"


def health_after(prev: TargetHealth | None, row: tuple) -> TargetHealth:
    """What _UPSERT_HEALTH makes of a target's health ``prev`` and a batch's health ``row`` (the Store keeps it for
    the windows the head answers; tests/store/test_head.py holds the two equal)."""
    _, health, error, ts, success, duration, failed, healthy = row
    if health == "down":  # a down target has only what this scrape's /health answered, if anything
        server_healthy = None if healthy is None else bool(healthy)
    elif healthy is not None:  # /health asked at this scrape
        server_healthy = bool(healthy)
    else:  # not asked: the last answer stands
        server_healthy = None if prev is None else prev.server_healthy
    return TargetHealth(
        health=health,
        last_error=error,
        last_scrape_ms=ts,
        last_success_ms=success if success is not None or prev is None else prev.last_success_ms,
        last_duration_s=duration,
        consecutive_failures=(prev.consecutive_failures + 1 if prev is not None else 1) if failed else 0,
        server_healthy=server_healthy,
    )


@dataclass(frozen=True)
class _Shape:
    """One engine's series keys at its last scrape and their series ids, in the same order."""

    values: tuple
    hists: tuple
    bounds: tuple
    value_ids: list[int]
    hist_ids: list[int]


@dataclass
class Batch:
    """A committed batch's rows, as the head takes them, and what the Store keeps of it."""

    plain: list[tuple[int, int, float, int]] = field(default_factory=list)  # (series id, ts, value, target id)
    hist: list[tuple[int, int, float, float, str, int]] = field(default_factory=list)
    raw_counts: list[tuple[float, ...]] | None = None  # each histogram's counts as scraped, when a head takes them
    healths: list[tuple] = field(default_factory=list)  # one _UPSERT_HEALTH row per item
    written: list[int] = field(default_factory=list)  # samples per item
    new_infos: list[tuple[str, list[SeriesInfo]]] = field(default_factory=list)  # series the batch created


class Ingest:
    """The write path and the ids it caches: targets, series and engine configs by key, and each engine's shape
    (its last scrape's keys and their ids)."""

    def __init__(self, url: object) -> None:
        """``url``: the store's, named in a write's error."""
        self.url = url
        self.targets: dict[str, int] = {}
        self.series_by_key: dict[tuple, int] = {}  # (target, engine, model, metric, labels, bounds) as scraped
        self.configs: dict[tuple[int, str, str], tuple[int, dict[str, str]]] = {}  # -> (row id, config)
        # (target id, engine, model) -> its last scrape's series keys and their ids, in the snapshot's order: the
        # next scrape of the same shape (the learned layout fills the same keys each time) skips the key lookups
        self.shapes: dict[tuple[int, str, str], _Shape] = {}

    def clear(self) -> None:
        """A rolled-back transaction may have created ids cached here: drop them all."""
        self.targets.clear()
        self.series_by_key.clear()
        self.configs.clear()
        self.shapes.clear()

    def forget(self, series_ids: Collection[int], config_ids: Collection[int]) -> None:
        """Retention deleted these series and engine-config rows: drop every id cached for them."""
        if series_ids:
            gone = set(series_ids)
            for key in [k for k, sid in self.series_by_key.items() if sid in gone]:
                del self.series_by_key[key]
            for key in [
                k
                for k, sh in self.shapes.items()
                if not (gone.isdisjoint(sh.value_ids) and gone.isdisjoint(sh.hist_ids))
            ]:
                del self.shapes[key]
        if config_ids:
            gone = set(config_ids)
            for key in [k for k, (rid, _) in self.configs.items() if rid in gone]:
                del self.configs[key]

    def target_id(self, conn, name: str, backend: str, url: str, labels: dict[str, str]) -> int:
        if name in self.targets:
            return self.targets[name]
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
        self.targets[name] = tid
        return tid

    def write(self, conn, items: Sequence[Scraped | Failed], head: Head | None) -> Batch:
        """Every row of ``items``, written in ``conn``'s transaction; a database error (locked, full, read-only) is a
        StoreError, and the caller's transaction rolls the whole batch back."""
        batch = Batch(raw_counts=[] if head is not None else None)
        scrapes: list[tuple] = []
        touches: list[tuple[int, int]] = []  # (ts, config row id): a config seen again
        try:
            for item in items:
                if isinstance(item, Failed):
                    tid = self.target_id(conn, item.target, item.backend, item.url, item.labels)
                    ts = ms(item.ts)
                    scrapes.append((tid, ts, item.duration_s, "down", item.error, 0, 0))
                    healthy = None if item.healthy is None else int(item.healthy)
                    batch.healths.append((tid, "down", item.error, ts, None, item.duration_s, 1, healthy))
                    batch.written.append(0)
                    continue
                snap = item.snap
                tid = self.target_id(conn, snap.target, snap.backend, item.url, item.labels)
                n = self._rows(conn, tid, snap, batch, touches, head)
                ts = ms(snap.ts)
                health = "degraded" if snap.problems else "up"
                error = "; ".join(snap.problems)
                scrapes.append((tid, ts, snap.duration_s, health, error, snap.body_bytes, n))
                healthy = None if snap.healthy is None else int(snap.healthy)
                batch.healths.append((tid, health, error, ts, ts, snap.duration_s, 0, healthy))
                batch.written.append(n)
            raw = driver_connection(conn)  # the driver's executemany: SQLAlchemy's own work costs more
            if batch.plain:
                raw.executemany(_INSERT_SAMPLES, batch.plain)
            if batch.hist:
                raw.executemany(_INSERT_HISTS, batch.hist)
            if scrapes:
                raw.executemany(_INSERT_SCRAPE, scrapes)
                raw.executemany(_UPSERT_HEALTH, batch.healths)  # in order: a target twice in one batch counts up
            if touches:
                raw.executemany(_TOUCH_CONFIG, touches)
        except sqlite3.DatabaseError as exc:  # locked, full, read-only: the whole batch rolls back
            raise StoreError(f"{self.url}: {exc}") from None
        return batch

    def _rows(self, conn, tid: int, snap: TargetSnapshot, batch: Batch, touches: list, head: Head | None) -> int:
        """Append one scrape's sample rows; returns how many."""
        ts = ms(snap.ts)
        n = 0
        plain, hist, raw_counts = batch.plain, batch.hist, batch.raw_counts
        for e in snap.engines:
            shape = self.shapes.get((tid, e.engine, e.model_name))
            values, hists = tuple(e.values), tuple(e.histograms)
            bounds = tuple(h.bounds for h in e.histograms.values())
            if shape is None or shape.values != values or shape.hists != hists or shape.bounds != bounds:
                shape = self._shape(conn, tid, snap, e, values, hists, bounds, batch, head)
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
        self,
        conn,
        tid: int,
        snap: TargetSnapshot,
        e: EngineSnapshot,
        values: tuple,
        hists: tuple,
        bounds: tuple,
        batch: Batch,
        head: Head | None,
    ) -> _Shape:
        """The series ids of one engine's keys (made to exist where new), remembered for its next scrape."""
        known = self.series_by_key
        keys = [(tid, e.engine, e.model_name, metric, lbl, None) for metric, lbl in values] + [
            (tid, e.engine, e.model_name, metric, lbl, b) for (metric, lbl), b in zip(hists, bounds)
        ]
        if any(k not in known for k in keys):
            known = self._new_series(conn, tid, snap, batch, head)
        ids = [known[k] for k in keys]
        shape = self.shapes[(tid, e.engine, e.model_name)] = _Shape(
            values, hists, bounds, ids[: len(values)], ids[len(values) :]
        )
        return shape

    def _new_series(self, conn, tid: int, snap: TargetSnapshot, batch: Batch, head: Head | None) -> dict[tuple, int]:
        """Every series of ``snap`` made to exist in two statements (a target's first scrape has dozens)."""
        rows: list[tuple] = []
        keys: list[tuple] = []
        for e in snap.engines:
            for metric, lbl in e.values:
                kind = "counter" if metric.endswith("_total") else "gauge"
                rows.append((tid, e.engine, e.model_name, metric, json.dumps(lbl), kind, ""))
                keys.append((tid, e.engine, e.model_name, metric, lbl, None))
            for (metric, lbl), h in e.histograms.items():
                rows.append((tid, e.engine, e.model_name, metric, json.dumps(lbl), "histogram", bounds_json(h.bounds)))
                keys.append((tid, e.engine, e.model_name, metric, lbl, h.bounds))
        raw = driver_connection(conn)
        raw.executemany(_INSERT_SERIES, rows)
        ids = {(r[1], r[2], r[3], r[4], r[6]): r[0] for r in raw.execute(SELECT_TARGET_SERIES, (tid,))}
        infos = []
        for row, key in zip(rows, keys):
            sid = self.series_by_key[key] = ids[(row[1], row[2], row[3], row[4], row[6])]
            if head is not None and row[3] in head.metrics:
                infos.append(
                    SeriesInfo(
                        sid,
                        row[1],
                        row[2],
                        row[3],
                        labels_parse(row[4]),
                        bounds_parse(row[6]) if row[5] == "histogram" else None,
                    )
                )
        if infos:
            batch.new_infos.append((snap.target, infos))
        return self.series_by_key

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
        cached = self.configs.get(key)
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
            self.configs[key] = cached
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
        self.configs[key] = (rid, dict(config))
