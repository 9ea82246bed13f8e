"""In-process benchmarks: exposition parsing, storage per target-day, and a 5-minute P99 over 30 days.

Storage history is written through the store's own API (Store.ingest of TargetSnapshots built from a
recorded vLLM exposition, then apply_retention), at the scale the ``--days`` option sets.
"""

from __future__ import annotations

import dataclasses
import gc
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

from tuner.collect.exposition import fast_samples, parse_exposition  # noqa: E402
from tuner.collect.layout import Layouts  # noqa: E402
from tuner.collect.snapshots import EngineSnapshot, Histogram, TargetSnapshot  # noqa: E402
from tuner.collect.vllm import snapshot_from_text  # noqa: E402
from tuner.config import Retention  # noqa: E402
from tuner.lab.proc import wait_for  # noqa: E402
from tuner.lab.replay import ReplayExposition  # noqa: E402
from tuner.signals.derive import SIGNAL_METRICS, compute_signals  # noqa: E402
from tuner.store.db import open_engine, upgrade  # noqa: E402
from tuner.store.retention import apply_retention  # noqa: E402
from tuner.store.store import Store  # noqa: E402

DAY = 86400.0


def _per_call_us(fn, iterations: int, rounds_n: int = 5) -> float:  # type: ignore[no-untyped-def]
    """Median over ``rounds_n`` rounds of the mean time per call, in µs (GC off while timing)."""
    fn()
    rounds = []
    gc.disable()
    try:
        for _ in range(rounds_n):
            start = time.perf_counter()
            for _ in range(iterations):
                fn()
            rounds.append((time.perf_counter() - start) / iterations * 1e6)
    finally:
        gc.enable()
    return statistics.median(rounds)


def bench_parser(fixture: Path, iterations: int = 200) -> dict[str, float]:
    text = fixture.read_text(encoding="utf-8")
    reference = _per_call_us(lambda: [s for f in text_string_to_metric_families(text) for s in f.samples], iterations)
    fast = _per_call_us(lambda: fast_samples(text), iterations)
    parse = _per_call_us(lambda: parse_exposition(text), iterations)
    snap = _per_call_us(lambda: snapshot_from_text(text, target="t", ts=0.0), iterations)
    # The daemon's path from the second scrape on: the same shape, counters advanced (ReplayExposition), read
    # by the layout learned from the first.
    replay = ReplayExposition(text)
    bodies = [replay.render().decode() for _ in range(64)]
    layouts = Layouts()
    snapshot_from_text(bodies[0], target="t", ts=0.0, layouts=layouts)
    turn = iter(range(10**9))
    by_layout = _per_call_us(
        lambda: snapshot_from_text(bodies[next(turn) % 64], target="t", ts=0.0, layouts=layouts), iterations
    )
    assert layouts.misses == 1, "the layout path missed on bodies of one shape"
    lines = sum(1 for line in text.split("\n") if line and not line.startswith("#"))
    return {
        "bytes": len(text.encode()),
        "samples": lines,
        "reference_us": reference,
        "fast_us": fast,
        "parse_exposition_us": parse,
        "snapshot_us": snap,
        "layout_us": by_layout,
        "ratio": reference / fast,
    }


def _advanced(base: TargetSnapshot, k: float, ts: float) -> TargetSnapshot:
    """``base`` with every counter and histogram grown by factor ``k`` (gauges as recorded).

    Counts stay whole numbers, as a server's are (their JSON, and so the bytes stored, stay realistic).
    """
    engines = []
    for e in base.engines:
        values = {key: (float(round(v * k)) if key[0].endswith("_total") else v) for key, v in e.values.items()}
        hists = {
            key: Histogram(h.bounds, tuple(float(round(c * k)) for c in h.counts), h.sum * k, float(round(h.count * k)))
            for key, h in e.histograms.items()
        }
        engines.append(EngineSnapshot(e.backend, e.engine, e.model_name, values, hists, e.config))
    return dataclasses.replace(base, ts=ts, engines=tuple(engines))


def _db_bytes(path: Path) -> int:
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.execute("VACUUM")  # what the file needs once freed pages are reused
    finally:
        con.close()
    return path.stat().st_size


def bench_storage(
    fixture: Path,
    *,
    days: int = 30,
    interval_s: float = 5.0,
    old_step_s: float = 60.0,
    retention: Retention | None = None,
    workdir: Path | None = None,
) -> dict[str, object]:
    """One target's ``days`` of history as retention leaves it; bytes per target-day; P99 query times.

    The raw part (the last ``retention.raw``) is ingested at ``interval_s``. Older history is ingested
    at ``old_step_s`` (several points per rollup step, so rollups see min/max/mean of real points) and
    thinned by apply_retention as the simulated clock passes each day (the daemon runs it every 10
    minutes; the rows left are the same): one point per series per rollup step plus one rollup row per
    gauge per step, the same rows 5 s history would leave.
    """
    retention = retention or Retention()
    tmp = Path(tempfile.mkdtemp(prefix="tuner-bench-store-", dir=workdir))
    db = tmp / "tuner.db"
    engine = open_engine(f"sqlite:///{db}")
    upgrade(engine)
    store = Store(engine)
    base = snapshot_from_text(fixture.read_text(encoding="utf-8"), target="t0000", ts=0.0)
    store.ensure_target("t0000", "vllm", "http://127.0.0.1:1")
    now = float(int(time.time() // 300 * 300))
    start = now - days * DAY
    raw_from = now - retention.raw.total_seconds()
    ts, k, n_ingest = start, 1.0, 0
    ingest_s = retention_s = 0.0
    counts: dict[str, int] = {}
    next_retention = start + DAY
    while ts < now:  # bounded: ts advances every pass
        t_ingest = time.perf_counter()
        store.ingest(_advanced(base, k, ts), url="http://127.0.0.1:1")
        ingest_s += time.perf_counter() - t_ingest
        n_ingest += 1
        k = 1.0 + (ts - start) / 300  # about the recorded counts again every 5 minutes
        ts += old_step_s if ts < raw_from else interval_s
        if ts >= next_retention or ts >= now:
            t_ret = time.perf_counter()
            for key, n in apply_retention(store, retention, now=min(ts, now)).items():
                counts[key] = counts.get(key, 0) + n
            retention_s += time.perf_counter() - t_ret
            next_retention += DAY
    engine.dispose()
    total = _db_bytes(db)
    con = sqlite3.connect(db)
    rows = {
        t: con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
        for t in ("samples", "hist_samples", "gauge_rollups", "scrapes")
    }
    # Bytes per row of each table (its indexes included), from SQLite's own page accounting.
    pages = dict(con.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall())
    pages["scrapes"] = pages.get("scrapes", 0) + pages.get("ix_scrapes_target_ts", 0)
    per_row = {t: pages.get(t, 0) / n if n else 0.0 for t, n in rows.items()}
    raw_ms = int(raw_from * 1000)
    raw_rows = {
        t: con.execute(f"SELECT COUNT(*) FROM {t} WHERE ts_ms >= ?", (raw_ms,)).fetchone()[0]
        for t in ("samples", "hist_samples", "scrapes")
    }
    con.close()
    raw_days = retention.raw.total_seconds() / DAY
    raw_bytes = sum(raw_rows[t] * per_row[t] for t in raw_rows)
    old_bytes = sum((rows[t] - raw_rows.get(t, 0)) * per_row[t] for t in rows)

    engine = open_engine(f"sqlite:///{db}")
    store = Store(engine, retention=retention)  # as the daemon and the CLI open it
    queries = {}
    for label, span, end, n in (
        ("5m, latest (raw points)", 300, now, 20),
        ("5m, 20 days back (one point per 5m step: no P99 possible)", 300, now - 20 * DAY, 20),
        ("10m, 20 days back (rolled-up points)", 600, now - 20 * DAY, 20),
        ("all 30 days", days * DAY, now, 1),
    ):

        def p99(end: float = end, span: float = span) -> float | None:
            sig = compute_signals(store.window("t0000", end - span, end, metrics=SIGNAL_METRICS))
            return sig.engines[0].e2e_p99 if sig.engines else None

        value = p99()
        ms = _per_call_us(p99, n, 5 if n > 1 else 1) / 1000
        window_ms = (
            _per_call_us(
                lambda end=end, span=span: store.window("t0000", end - span, end, metrics=SIGNAL_METRICS),
                n,
                5 if n > 1 else 1,
            )
            / 1000
        )
        queries[label] = {"ms": ms, "window_ms": window_ms, "e2e_p99_s": value}
    engine.dispose()
    return {
        "days": days,
        "ingests": n_ingest,
        "ingest_s": ingest_s,
        "retention_s": retention_s,
        "retention_counts": counts,
        "db_bytes": total,
        "bytes_per_target_day": total / days,
        "raw_days": raw_days,
        "rows": rows,
        "bytes_per_row": per_row,
        "bytes_per_raw_day": raw_bytes / raw_days,
        "bytes_per_rolled_day": old_bytes / (days - raw_days),
        "queries": queries,
        "path": str(db),
    }


def bench_scrape_loop(fixture: Path, iterations: int = 300, workdir: Path | None = None) -> dict[str, float]:
    """One thread scraping one farm endpoint and storing it the daemon's way, stage by stage (µs per scrape,
    medians): one connection for both requests, the learned layout, writes in batches.

    What a scrape costs without 32 threads contending for the GIL: the floor of tuner's per-scrape CPU.
    """
    import subprocess
    import sys

    from tuner.collect import http
    from tuner.collect.exposition import decode_body
    from tuner.store.store import Scraped

    tmp = Path(tempfile.mkdtemp(prefix="tuner-bench-loop-", dir=workdir))
    ports = tmp / "ports.txt"
    farm = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).parent / "farm.py"),
            "--targets",
            "1",
            "--fixture",
            str(fixture),
            "--ports-file",
            str(ports),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(ports.exists, 60, "the farm's ports", proc=farm, every_s=0.05)
        url = f"http://127.0.0.1:{ports.read_text().split()[0]}"
        engine = open_engine(f"sqlite:///{tmp / 'tuner.db'}")
        upgrade(engine)
        store = Store(engine)
        stages: dict[str, list[float]] = {
            k: []
            for k in ("GET /metrics + /health (one connection)", "read by the layout", "Store.write (batches of 50)")
        }
        layouts = Layouts()
        batch: list[Scraped] = []
        for i in range(iterations):
            t0 = time.perf_counter()
            with http.Peer(url) as peer:
                body = peer.get("/metrics", timeout_s=3, max_bytes=10 * 2**20).body
                peer.get("/health", timeout_s=3, max_bytes=65536)
            t1 = time.perf_counter()
            snap = snapshot_from_text(
                decode_body(body),
                target="t",
                ts=1000.0 + 5 * i,
                duration_s=t1 - t0,
                body_bytes=len(body),
                layouts=layouts,
            )
            t2 = time.perf_counter()
            batch.append(Scraped(snap, url))
            if len(batch) == 50:
                store.write(batch)
                stages["Store.write (batches of 50)"].append((time.perf_counter() - t2) * 1e6 / 50)
                batch = []
            stages["GET /metrics + /health (one connection)"].append((t1 - t0) * 1e6)
            stages["read by the layout"].append((t2 - t1) * 1e6)
        assert layouts.misses == 1, "the layout path missed on one endpoint's scrapes"
        engine.dispose()
    finally:
        farm.terminate()
        farm.wait(10)
    out = {k: statistics.median(v) for k, v in stages.items()}
    out["total"] = sum(out.values())
    return out
