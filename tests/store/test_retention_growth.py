"""Retention keeps a long-lived store flat (issue 39, item 14): labels that change at every scrape (a model_name
each time: ~36 series and an engine config a scrape), an Alertmanager that never answers (the outbox) and alert
history are pruned with the ids the store caches for them, and the freed pages go back to the file system
(incremental vacuum), also for a store made before tuner turned it on. Hours pass on an injected clock: every
scrape is ingested through the store's own API at its simulated time."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from tests.helpers import fixture_text
from tuner.collect.vllm import snapshot_from_text
from tuner.config import Retention
from tuner.signals.derive import SIGNAL_METRICS
from tuner.store.alerts import enqueue, save_states
from tuner.store.db import open_engine, upgrade
from tuner.store.retention import apply_retention
from tuner.store.store import Store

T0 = 1_800_000_000.0
STEP_S = 60.0  # one scrape a simulated minute
RETENTION = Retention(raw=timedelta(minutes=30), rollup=timedelta(hours=1), rollup_step=timedelta(minutes=5))
TABLES = (
    "series",
    "samples",
    "hist_samples",
    "gauge_rollups",
    "engine_configs",
    "scrapes",
    "alert_events",
    "alert_outbox",
)
BASE = snapshot_from_text(fixture_text("vllm-0.32-cpu/metrics_after_load.txt"), target="chat", ts=T0)


def _rows(store: Store) -> dict[str, int]:
    with store.engine.connect() as conn:
        raw = conn.connection.driver_connection
        return {t: raw.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in TABLES}


def _size(path: Path) -> int:
    """The database file's size once its WAL is written back, and that no free page is left in it."""
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert db.execute("PRAGMA freelist_count").fetchone()[0] == 0  # retention gave them back
    return path.stat().st_size


def _caches(store: Store) -> dict[str, int]:
    head = store._head  # noqa: SLF001  (what the daemon's process holds)
    return {
        "series_ids": len(store._ingest.series_by_key),
        "shapes": len(store._ingest.shapes),  # noqa: SLF001
        "configs": len(store._ingest.configs),
        "head_series": len(head._by_id) if head else 0,
    }  # noqa: SLF001


def _feed(store: Store, start: int, minutes: int, *, churn: bool) -> None:
    """One scrape a minute (a new model_name each when ``churn``), an alert event and an undeliverable
    notification a minute, a window read every 5 minutes (it fills the head), retention every 10."""
    for i in range(start, start + minutes):
        now = T0 + i * STEP_S
        model = f"m{i}" if churn else "steady"
        engines = tuple(replace(e, model_name=model) for e in BASE.engines)
        store.ingest(replace(BASE, ts=now, engines=engines))
        event = {
            "ts_ms": int(now * 1000),
            "rule": "g/KV",
            "fingerprint": f"{i:016x}",
            "labels": "{}",
            "from_state": "inactive",
            "to_state": "pending",
            "value": 1.0,
        }
        save_states(store, [], events=[event], now_ms=int(now * 1000))
        enqueue(store, "http://127.0.0.1:9", [{"labels": {"alertname": "KV", "model_name": model}}], int(now * 1000))
        if i % 5 == 0:
            store.window("chat", now - 300, now, metrics=SIGNAL_METRICS)
        if i % 10 == 0:
            apply_retention(store, RETENTION, now=now, outbox_max_age=timedelta(minutes=15))


def test_churning_labels_leave_rows_caches_and_file_flat_and_quiet_gives_space_back(tmp_path):
    path = tmp_path / "tuner.db"
    engine = open_engine(f"sqlite:///{path}")
    upgrade(engine)
    store = Store(engine, retention=RETENTION)
    store.keep_head(SIGNAL_METRICS)
    store.ensure_target("chat", "vllm", "http://127.0.0.1:9")

    _feed(store, 0, 150, churn=True)  # past the rollup age: from here on as much goes as comes
    at_150, size_150, caches_150 = _rows(store), _size(path), _caches(store)
    _feed(store, 150, 150, churn=True)
    at_300, size_300, caches_300 = _rows(store), _size(path), _caches(store)
    for table in TABLES:
        assert at_300[table] <= at_150[table] * 1.1 + 5, (table, at_150, at_300)
    assert at_300["series"] < 36 * 80  # about an hour and a half of new series at most, not five hours'
    assert at_300["alert_outbox"] <= 15 + 10 and at_300["alert_events"] <= 60 + 10 + 1  # retention every 10 min
    for name, n in caches_300.items():
        assert n <= caches_150[name] * 1.1 + 5, (name, caches_150, caches_300)
    assert size_300 <= size_150 * 1.15, (size_150, size_300)

    # The labels settle: an hour and more later what the churn left is gone, and so is its space.
    _feed(store, 300, 120, churn=False)
    quiet, size_quiet = _rows(store), _size(path)
    assert quiet["series"] <= 2 * len([k for e in BASE.engines for k in (*e.values, *e.histograms)]), quiet
    assert size_quiet < size_300 * 0.8, (size_300, size_quiet)
    window = store.window("chat", T0 + 419 * STEP_S - 300, T0 + 419 * STEP_S, metrics=SIGNAL_METRICS)
    assert [e.model_name for e in window.engines] == ["steady"]  # what is kept still reads back
    engine.dispose()


def test_a_store_made_before_incremental_vacuum_is_converted_once_by_db_upgrade_and_by_run(tmp_path):
    for how in ("db", "run"):
        path = tmp_path / f"{how}.db"
        with sqlite3.connect(path) as old:  # as every store was made before: auto_vacuum off, a table in it
            old.execute("CREATE TABLE kept (x)")
            old.execute("INSERT INTO kept VALUES ('still here')")
        assert sqlite3.connect(path).execute("PRAGMA auto_vacuum").fetchone()[0] == 0
        cfg = tmp_path / f"{how}.yaml"
        cfg.write_text(f"store: {{url: 'sqlite:///{path}'}}\nlisten: 127.0.0.1:0\n")
        cli = [sys.executable, "-m", "tuner.cli", "--config", str(cfg)]
        if how == "run":  # the schema first, the conversion left to the daemon's start
            engine = open_engine(f"sqlite:///{path}")
            from alembic import command

            from tuner.store.db import _alembic_config

            with engine.begin() as conn:
                alembic = _alembic_config(engine)
                alembic.attributes["connection"] = conn
                command.upgrade(alembic, "head")
            engine.dispose()
            assert sqlite3.connect(path).execute("PRAGMA auto_vacuum").fetchone()[0] == 0
            out = subprocess.run([*cli, "run", "--for", "1s"], capture_output=True, text=True, timeout=120)
            assert "converted to incremental vacuum" in out.stderr, out.stderr
        else:
            out = subprocess.run([*cli, "db", "upgrade"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        db = sqlite3.connect(path)
        assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
        assert db.execute("SELECT x FROM kept").fetchall() == [("still here",)]
        again = subprocess.run([*cli, "run", "--for", "1s"], capture_output=True, text=True, timeout=120)
        assert again.returncode == 0 and "converted" not in again.stderr, again.stderr  # once


def test_the_wal_file_shrinks_back_after_a_large_transaction_is_written_back(tmp_path):
    """A retention run deletes much at once; its pages pass through the WAL, whose file kept that size for good
    (41 MB of a 94 MB store in bench/soak.py). Once give_back_space has checkpointed, the next write leaves the WAL
    at most WAL_SIZE_LIMIT."""
    from tuner.store.db import WAL_SIZE_LIMIT, give_back_space

    path = tmp_path / "tuner.db"
    engine = open_engine(f"sqlite:///{path}")
    upgrade(engine)
    store = Store(engine, retention=RETENTION)
    store.ensure_target("chat", "vllm", "http://127.0.0.1:9")
    label = "x" * 2000
    events = [
        {
            "ts_ms": i,
            "rule": "g/KV",
            "fingerprint": f"{i:016x}",
            "labels": label,
            "from_state": "inactive",
            "to_state": "pending",
            "value": 1.0,
        }
        for i in range(15000)
    ]
    save_states(store, [], events=events, now_ms=1)  # one transaction of ~30 MB
    wal = Path(f"{path}-wal")
    assert wal.stat().st_size > 2 * WAL_SIZE_LIMIT  # the case: a WAL larger than the limit
    give_back_space(engine, lock=store.lock)  # what apply_retention does last: its checkpoint writes the WAL back
    save_states(store, [], events=events[:1], now_ms=2)  # the next write starts the WAL over
    assert wal.stat().st_size <= WAL_SIZE_LIMIT, wal.stat().st_size
    engine.dispose()
