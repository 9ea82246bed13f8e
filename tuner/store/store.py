"""Writing snapshots and reading windows back. One writer at a time (a lock); readers never wait (WAL).

The Store holds what one process keeps between calls: the write lock, the ids the write path caches
(tuner/store/ingest.py), the head of recent points (tuner/store/head.py) and each target's meta. The SQL of a write
is ingest.py's; of a read, reading.py's."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Collection, Iterable, Sequence

from sqlalchemy import Engine, delete, func, insert, select

from tuner.collect.snapshots import GpuReading, TargetSnapshot
from tuner.config import Retention
from tuner.errors import StoreError
from tuner.store import reading
from tuner.store.db import Tx
from tuner.store.head import MAX_SPAN_MS, Head, SeriesInfo
from tuner.store.ingest import Failed, Ingest, Scraped, health_after
from tuner.store.models import GpuProcessRow, GpuSampleRow, ScrapeRow, TargetRow
from tuner.store.rows import driver_connection, ms
from tuner.store.window import GpuLatest, HistPoints, Points, TargetHealth, TargetWindow

__all__ = ["Store", "Scraped", "Failed", "GpuLatest"]


class Store:
    """The only module that writes SQL. Methods take snapshots in and give windows out."""

    def __init__(self, engine: Engine, *, retention: Retention | None = None) -> None:
        """``retention``: the config's; a window longer than its raw span is read at its rollup step (window())."""
        self.engine = engine
        self.retention = retention
        self._lock = threading.Lock()
        self._ingest = Ingest(engine.url)
        self._scrapes: dict[str, int] = {}  # target -> scrapes stored or recorded failed by this process
        self._head: Head | None = None
        # target -> (backend, configs, health) as SQLite holds them, for the windows the head answers: read once,
        # then kept by this Store's writes (_keep_meta), not read back at every window (3 queries and a pooled
        # connection: ~40% of a head window's cost at 1,000 targets, bench/results/2026-11-25-1619-whole-run.md)
        self._meta: dict[str, reading.Meta] = {}

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
            return self._ingest.target_id(conn, name, backend, url, labels or {})

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
        self._ingest.clear()
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
        with self._lock:
            with self.begin() as conn:
                batch = self._ingest.write(conn, items, self._head)
            if self._head is not None:  # committed: the head holds what SQLite holds
                for target, infos in batch.new_infos:
                    self._head.new_series(target, infos)
                self._head.append(batch.plain, batch.hist, batch.raw_counts or ())
            if self._meta:
                self._keep_meta(items, batch.healths)
        for item in items:  # committed
            self._scrapes[item.target] = self._scrapes.get(item.target, 0) + 1
        return batch.written

    def _keep_meta(self, items: Sequence[Scraped | Failed], healths: list[tuple]) -> None:
        """The committed batch's health rows and configs on the targets whose meta is kept: what SQLite made of
        them (ingest.health_after; tests/store/test_head.py holds the two equal)."""
        for item, row in zip(items, healths):
            kept = self._meta.get(item.target)
            if kept is None:
                continue
            backend, configs, prev = kept
            if prev is not None and row[3] < prev.last_scrape_ms:  # a clock stepped back: read it again when asked
                del self._meta[item.target]
                continue
            if isinstance(item, Scraped) and any(e.config for e in item.snap.engines):
                configs = dict(configs)  # a window already handed out keeps its own
                for e in item.snap.engines:
                    if e.config:
                        configs[(e.engine, e.model_name)] = dict(sorted(e.config.items()))
            self._meta[item.target] = (backend, configs, health_after(prev, row))

    def ingest_gpu(self, reading: GpuReading) -> int:
        if not reading.available:
            return 0
        ts = ms(reading.ts)
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
                    ScrapeRow.ts_ms >= ms(start),
                    ScrapeRow.ts_ms <= ms(end),
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
            return reading.target_health(driver_connection(conn), target)

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
        lo, hi = ms(start), ms(end)
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
            try:
                return reading.window(
                    driver_connection(conn), target, lo, hi, metrics=metrics, step=step, names=self.target_names
                )
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"{self.engine.url}: {exc}") from None

    def _head_window(
        self, target: str, lo: int, hi: int, got: list[tuple[SeriesInfo, Points | HistPoints]]
    ) -> TargetWindow:
        """The window from the head's points, with the target's backend, health and configs (read from SQLite
        the first time, then kept by the writes: _keep_meta)."""
        kept = self._meta.get(target)
        if kept is None:
            with self._lock, self.engine.connect() as conn:  # no write lands between the read and keeping it
                try:
                    kept = reading.meta(driver_connection(conn), target, self.target_names)
                except sqlite3.DatabaseError as exc:
                    raise StoreError(f"{self.engine.url}: {exc}") from None
                self._meta[target] = kept
        backend, configs, health = kept
        got.sort(key=lambda g: g[0].id)  # the order a read from SQLite gives (series id)
        return reading.assemble(
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
            try:
                found = reading.head_points(driver_connection(conn), target, lo, head.metrics)
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"{self.engine.url}: {exc}") from None
            if found is not None:
                head.fill(target, lo, hi - lo, *found, metrics)

    def gpu_latest(self, max_age_s: float, now: float) -> list[GpuLatest]:
        with self.engine.connect() as conn:
            last = conn.execute(select(GpuSampleRow.ts_ms).order_by(GpuSampleRow.ts_ms.desc()).limit(1)).scalar()
            if last is None or last < ms(now - max_age_s):
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
        self._ingest.forget(series_ids, config_ids)
        if series_ids and self._head is not None:
            self._head.forget(set(series_ids))
        if config_ids:
            self._meta.clear()  # each target's configs are read again at its next window

    def delete_targets_except(self, keep: Iterable[str]) -> None:
        """Not used by the daemon (history is kept when a target leaves the config); for tests/tools."""
        with self._lock, self.begin() as conn:
            conn.execute(delete(TargetRow).where(TargetRow.name.not_in(list(keep))))
            self._forget_ids()
