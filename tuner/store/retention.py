"""Retention and rollups.

Raw points older than ``retention.raw`` are thinned to the last point of each ``rollup_step``,
plus the two points around each counter reset (so an increase between kept points is exact for
counters and histograms, resets included), and gauges
also get min/max/mean per step in ``gauge_rollups`` before thinning. Everything older than
``retention.rollup`` is deleted, as are scrape records older than ``retention.raw``.
"""

from __future__ import annotations

from sqlalchemy import text

from tuner.config import Retention
from tuner.store.store import Store

__all__ = ["apply_retention"]


def apply_retention(store: Store, retention: Retention, *, now: float) -> dict[str, int]:
    step = int(retention.rollup_step.total_seconds() * 1000)
    raw_cutoff = (int((now - retention.raw.total_seconds()) * 1000) // step) * step  # whole steps only
    drop_before = int((now - retention.rollup.total_seconds()) * 1000)
    counts: dict[str, int] = {}
    with store._lock, store._write() as conn:
        done = conn.execute(text("SELECT value FROM meta WHERE key = 'thinned_until_ms'")).scalar()
        lo = int(done) if done is not None else 0
        if raw_cutoff > lo:
            counts["rollups"] = conn.execute(text("""
                INSERT OR REPLACE INTO gauge_rollups (series_id, bucket_ms, min, max, sum, count)
                SELECT s.series_id, (s.ts_ms / :step) * :step, MIN(s.value), MAX(s.value), SUM(s.value), COUNT(*)
                FROM samples s JOIN series r ON r.id = s.series_id
                WHERE r.kind = 'gauge' AND s.ts_ms >= :lo AND s.ts_ms < :hi
                GROUP BY s.series_id, s.ts_ms / :step"""), {"step": step, "lo": lo, "hi": raw_cutoff}).rowcount
            for table, value, kind in (("samples", "value", "counter"), ("hist_samples", "count", "histogram")):
                # Keep the last point of each step, and both points around a counter reset: with only
                # the last ones, the growth between the last kept point and the reset would be lost.
                counts[f"thinned_{table}"] = conn.execute(text(f"""
                    DELETE FROM {table} WHERE ts_ms >= :lo AND ts_ms < :hi
                    AND (series_id, ts_ms) NOT IN (
                        SELECT series_id, MAX(ts_ms) FROM {table} WHERE ts_ms >= :lo AND ts_ms < :hi
                        GROUP BY series_id, ts_ms / :step
                        UNION ALL
                        SELECT series_id, ts_ms FROM (
                            SELECT t.series_id, t.ts_ms, t.{value} AS v,
                                   LAG(t.{value}) OVER w AS prev, LEAD(t.{value}) OVER w AS nxt
                            FROM {table} t JOIN series r ON r.id = t.series_id
                            WHERE r.kind = '{kind}' AND t.ts_ms >= :lo - :step AND t.ts_ms < :hi
                            WINDOW w AS (PARTITION BY t.series_id ORDER BY t.ts_ms))
                        WHERE v < prev OR nxt < v)"""),
                    {"step": step, "lo": lo, "hi": raw_cutoff}).rowcount
            conn.execute(text("INSERT OR REPLACE INTO meta (key, value) VALUES ('thinned_until_ms', :v)"),
                         {"v": str(raw_cutoff)})
        for table, col in (("samples", "ts_ms"), ("hist_samples", "ts_ms"), ("gauge_rollups", "bucket_ms"),
                           ("gpu_samples", "ts_ms"), ("gpu_processes", "ts_ms")):
            counts[f"dropped_{table}"] = conn.execute(
                text(f"DELETE FROM {table} WHERE {col} < :t"), {"t": drop_before}).rowcount
        counts["dropped_scrapes"] = conn.execute(
            text("DELETE FROM scrapes WHERE ts_ms < :t"), {"t": raw_cutoff}).rowcount
    return counts
