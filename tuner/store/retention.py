"""Retention and rollups.

Every run marks (``keep = 1``) the points of each completed rollup step that thinning will keep: the
last point of the step, plus the two points around each counter or histogram reset (so an increase
between kept points is exact, resets included). Long windows read the marked points alone
(Store.window). Raw points older than ``retention.raw`` that are not marked are deleted, and gauges
get min/max/mean per step in ``gauge_rollups`` first. Everything older than ``retention.rollup`` is
deleted, as are scrape records older than ``retention.raw``.

Everything else that grows goes too: alert history older than ``retention.rollup``; notifications that waited in
the outbox longer than ``outbox_max_age`` (an Alertmanager down for days: what they said is stale, and newer ones
carry the alerts still active); series with no point left and engine configs last seen before ``retention.rollup``
(labels that change at every scrape made ~36 series a scrape), with the ids the store caches for them. The pages
freed go back to the file system (incremental vacuum, tuner/store/db.py).
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text

from tuner.config import Retention
from tuner.store.db import give_back_space
from tuner.store.reading import MARKED_UNTIL
from tuner.store.store import Store

__all__ = ["apply_retention"]


def _meta(conn, key: str) -> int:
    done = conn.execute(text("SELECT value FROM meta WHERE key = :k"), {"k": key}).scalar()
    return int(done) if done is not None else 0


def _set_meta(conn, key: str, value: int) -> None:
    conn.execute(text("INSERT OR REPLACE INTO meta (key, value) VALUES (:k, :v)"), {"k": key, "v": str(value)})


def apply_retention(
    store: Store, retention: Retention, *, now: float, outbox_max_age: timedelta | None = None
) -> dict[str, int]:
    """One retention run; how many rows each part touched (``freed_pages``: given back to the file system)."""
    counts: dict[str, int] = {}
    with store.lock:
        with store.begin() as conn:
            gone = _prune(conn, counts, retention, now=now, outbox_max_age=outbox_max_age)
        store.forget_deleted(*gone)  # committed: the ids cached for them go too
    counts["freed_pages"] = give_back_space(store.engine, lock=store.lock)
    return counts


def _prune(
    conn, counts: dict[str, int], retention: Retention, *, now: float, outbox_max_age: timedelta | None
) -> tuple[list[int], list[int]]:
    step = int(retention.rollup_step.total_seconds() * 1000)
    now_ms = int(now * 1000)
    # A step is marked once a whole step has passed after its end (a scrape is stored after it started).
    mark_to = (now_ms - step) // step * step
    raw_cutoff = min((int((now - retention.raw.total_seconds()) * 1000) // step) * step, mark_to)
    drop_before = int((now - retention.rollup.total_seconds()) * 1000)
    lo = _meta(conn, MARKED_UNTIL)
    if mark_to > lo:
        for table, value, kind in (("samples", "value", "counter"), ("hist_samples", "count", "histogram")):
            # The last point of each step, and both points around a counter reset: with only the last
            # ones, the growth between the last kept point and the reset would be lost.
            counts[f"marked_{table}"] = conn.execute(
                text(f"""
                UPDATE {table} SET keep = 1 WHERE keep = 0 AND (target_id, ts_ms, series_id) IN (
                    SELECT target_id, MAX(ts_ms), series_id FROM {table} WHERE ts_ms >= :lo AND ts_ms < :hi
                    GROUP BY series_id, ts_ms / :step
                    UNION ALL
                    SELECT target_id, ts_ms, series_id FROM (
                        SELECT t.target_id, t.series_id, t.ts_ms, t.{value} AS v,
                               LAG(t.{value}) OVER w AS prev, LEAD(t.{value}) OVER w AS nxt
                        FROM {table} t JOIN series r ON r.id = t.series_id
                        WHERE r.kind = '{kind}' AND t.ts_ms >= :lo - :step AND t.ts_ms < :hi
                        WINDOW w AS (PARTITION BY t.series_id ORDER BY t.ts_ms))
                    WHERE v < prev OR nxt < v)"""),
                {"step": step, "lo": lo, "hi": mark_to},
            ).rowcount
        _set_meta(conn, MARKED_UNTIL, mark_to)
    lo = _meta(conn, "thinned_until_ms")
    if raw_cutoff > lo:
        counts["rollups"] = conn.execute(
            text("""
            INSERT OR REPLACE INTO gauge_rollups (series_id, bucket_ms, min, max, sum, count)
            SELECT s.series_id, (s.ts_ms / :step) * :step, MIN(s.value), MAX(s.value), SUM(s.value), COUNT(*)
            FROM samples s JOIN series r ON r.id = s.series_id
            WHERE r.kind = 'gauge' AND s.ts_ms >= :lo AND s.ts_ms < :hi
            GROUP BY s.series_id, s.ts_ms / :step"""),
            {"step": step, "lo": lo, "hi": raw_cutoff},
        ).rowcount
        for table in ("samples", "hist_samples"):
            counts[f"thinned_{table}"] = conn.execute(
                text(f"DELETE FROM {table} WHERE ts_ms >= :lo AND ts_ms < :hi AND keep = 0"),
                {"lo": lo, "hi": raw_cutoff},
            ).rowcount
        _set_meta(conn, "thinned_until_ms", raw_cutoff)
    for table, col in (
        ("samples", "ts_ms"),
        ("hist_samples", "ts_ms"),
        ("gauge_rollups", "bucket_ms"),
        ("gpu_samples", "ts_ms"),
        ("gpu_processes", "ts_ms"),
    ):
        counts[f"dropped_{table}"] = conn.execute(
            text(f"DELETE FROM {table} WHERE {col} < :t"), {"t": drop_before}
        ).rowcount
    counts["dropped_scrapes"] = conn.execute(text("DELETE FROM scrapes WHERE ts_ms < :t"), {"t": raw_cutoff}).rowcount
    counts["dropped_alert_events"] = conn.execute(
        text("DELETE FROM alert_events WHERE ts_ms < :t"), {"t": drop_before}
    ).rowcount
    if outbox_max_age is not None:
        counts["dropped_outbox"] = conn.execute(
            text("DELETE FROM alert_outbox WHERE created_ms < :t"),
            {"t": now_ms - int(outbox_max_age.total_seconds() * 1000)},
        ).rowcount
    # A series is kept while any row of it is (a raw point, a kept point, a gauge rollup): one scan of each table.
    series = [
        r[0]
        for r in conn.execute(
            text(
                "SELECT id FROM series WHERE id NOT IN (SELECT series_id FROM samples) "
                "AND id NOT IN (SELECT series_id FROM hist_samples) AND id NOT IN (SELECT series_id FROM gauge_rollups)"
            )
        )
    ]
    configs = [
        r[0] for r in conn.execute(text("SELECT id FROM engine_configs WHERE last_seen_ms < :t"), {"t": drop_before})
    ]
    for table, ids in (("series", series), ("engine_configs", configs)):
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            conn.execute(text(f"DELETE FROM {table} WHERE id IN ({','.join(map(str, chunk))})"))
        counts[f"dropped_{table}"] = len(ids)
    return series, configs
