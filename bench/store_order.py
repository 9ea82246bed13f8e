"""The samples table's two key orders with SQLite alone: CPU per scrape as the table fills, and one window read.

1,000 targets of 36 series each, one row per series every 5 s of simulated time, 50 scrapes a transaction (the
daemon's batch at 1,000 targets), WAL and synchronous=NORMAL as tuner opens its store. ``series`` is the key
(series_id, ts_ms) tuner used before migration 0007, ``target`` the key (target_id, ts_ms, series_id) it uses now.
No tuner code runs: what is measured is SQLite's cost for the order alone.

    python bench/store_order.py series 144; python bench/store_order.py target 144   (144 ticks: 12 minutes)
"""

from __future__ import annotations

import os
import random
import sqlite3
import sys
import tempfile
import time

TARGETS, SERIES, BATCH = 1000, 36, 50


def main() -> int:
    order, ticks = sys.argv[1], int(sys.argv[2])
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(f"{tmp}/x.db", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        if order == "series":
            db.execute(
                "CREATE TABLE s (series_id INTEGER, ts_ms INTEGER, value REAL, keep INTEGER DEFAULT 0, "
                "PRIMARY KEY (series_id, ts_ms)) WITHOUT ROWID"
            )
            insert = "INSERT OR IGNORE INTO s (series_id, ts_ms, value) VALUES (?, ?, ?)"

            def row(t: int, sid: int, ts: int, v: float) -> tuple:
                return (sid, ts, v)
        else:
            db.execute(
                "CREATE TABLE s (target_id INTEGER, ts_ms INTEGER, series_id INTEGER, value REAL, "
                "keep INTEGER DEFAULT 0, PRIMARY KEY (target_id, ts_ms, series_id)) WITHOUT ROWID"
            )
            insert = "INSERT OR IGNORE INTO s (target_id, ts_ms, series_id, value) VALUES (?, ?, ?, ?)"

            def row(t: int, sid: int, ts: int, v: float) -> tuple:
                return (t, ts, sid, v)

        ts0 = 1_800_000_000_000
        for k in range(ticks):
            c0 = time.process_time()
            for j in range(0, TARGETS, BATCH):
                rows = [
                    row(t, t * SERIES + s, ts0 + k * 5000 + t * 5, random.random() * 1e6)
                    for t in range(j, j + BATCH)
                    for s in range(SERIES)
                ]
                db.execute("BEGIN")
                db.executemany(insert, rows)
                db.execute("COMMIT")
            if k % 24 == 23:
                print(
                    f"{order}: minute {(k + 1) / 12:.0f}: {(time.process_time() - c0) / TARGETS * 1e6:.0f} µs CPU "
                    "per scrape (rows built in Python included)",
                    flush=True,
                )
        start = time.perf_counter()
        for t in range(0, TARGETS, 10):  # a 10-minute window of 20 of a target's series
            ids = list(range(t * SERIES, t * SERIES + 20))
            lo, hi = ts0 + (ticks - 120) * 5000, ts0 + ticks * 5000
            marks = ",".join("?" * len(ids))
            if order == "series":
                db.execute(
                    f"SELECT series_id, ts_ms, value FROM s WHERE series_id IN ({marks}) AND ts_ms BETWEEN ? "
                    "AND ? ORDER BY series_id, ts_ms",
                    (*ids, lo, hi),
                ).fetchall()
            else:
                db.execute(
                    f"SELECT series_id, ts_ms, value FROM s WHERE target_id = ? AND ts_ms BETWEEN ? AND ? "
                    f"AND series_id IN ({marks}) ORDER BY series_id, ts_ms",
                    (t, lo, hi, *ids),
                ).fetchall()
        print(f"{order}: a window read {(time.perf_counter() - start) / (TARGETS / 10) * 1e3:.2f} ms")
        db.close()
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
