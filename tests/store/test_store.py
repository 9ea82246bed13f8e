"""The store on real SQLite files: schema checks, ingest and windows, health, configs, retention."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.helpers import VLLM_DIR, bucket_counts, migrated_store, series_values, value_of
from tuner.collect import vllm
from tuner.collect.snapshots import EngineSnapshot, Histogram, TargetSnapshot
from tuner.config import Retention
from tuner.errors import SchemaOutdatedError, StoreError
from tuner.signals.promql import increase
from tuner.store.db import Tx, check_schema, current_revision, head_revision, open_engine, upgrade
from tuner.store.retention import apply_retention
from tuner.store.store import Failed, Scraped, Store

T = 1_700_000_000.0


def _snapshot(name: str, ts: float, target: str = "gpu-box") -> TargetSnapshot:
    return vllm.snapshot_from_text((VLLM_DIR / name).read_text(encoding="utf-8"), target=target, ts=ts)


# ---- schema ---------------------------------------------------------------------------------------------


def test_fresh_database_asks_for_tuner_db_upgrade(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
    with pytest.raises(SchemaOutdatedError) as info:
        check_schema(engine)
    assert "tuner db upgrade" in str(info.value)
    assert (info.value.current, info.value.head) == (None, head_revision())


def test_upgrade_reaches_head_in_wal_mode(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
    before, after = upgrade(engine)
    assert (before, after) == (None, head_revision())
    check_schema(engine)  # no longer raises
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    assert upgrade(engine) == (head_revision(), head_revision())  # a second upgrade is a no-op


def test_database_in_a_missing_directory_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        open_engine(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'tuner.db'}")


def test_a_file_that_is_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "tuner.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open"):
        check_schema(open_engine(f"sqlite:///{path}"))


def test_one_transaction_helper_names_the_database_and_undoes_what_the_store_cached(tmp_path: Path) -> None:
    """Store, journal and recommendations write through one helper (store.db.Tx)."""
    store = migrated_store(tmp_path)
    store.ingest(_snapshot("metrics_idle.txt", T))
    # A storage error inside a write: StoreError naming the database; the row and the id cached with it go.
    with pytest.raises(StoreError, match=str(tmp_path / "tuner.db")) as err:
        with store.lock, store.begin() as conn:
            store._ingest.target_id(conn, "new-target", "vllm", "http://127.0.0.1:9", {})
            assert "new-target" in store._ingest.targets
            conn.execute(text("INSERT INTO no_such_table VALUES (1)"))
    assert "no such table" in str(err.value)
    assert "new-target" not in store._ingest.targets and store.target_names() == ["gpu-box"]
    # Any other error rolls back too, is told to on_rollback, and propagates as it was.
    told: list[str] = []
    with pytest.raises(ValueError, match="boom"):
        with Tx(store.engine, on_rollback=lambda: told.append("rolled back")) as conn:
            conn.execute(text("UPDATE targets SET name = 'renamed'"))
            raise ValueError("boom")
    assert told == ["rolled back"] and store.target_names() == ["gpu-box"]
    with Tx(store.engine, on_rollback=lambda: told.append("not this time")):
        pass
    assert told == ["rolled back"]


# ---- ingest and window ------------------------------------------------------------------------------------


def test_two_recorded_scrapes_come_back_as_two_points(tmp_path: Path) -> None:
    store = migrated_store(tmp_path)
    first, second = "metrics_under_load.txt", "metrics_after_load.txt"
    texts = [(VLLM_DIR / n).read_text(encoding="utf-8") for n in (first, second)]
    n = store.ingest(_snapshot(first, T), url="http://10.0.0.5:8000")
    assert n > 0
    store.ingest(_snapshot(second, T + 5), url="http://10.0.0.5:8000")

    win = store.window("gpu-box", T, T + 5)
    assert (win.target, win.backend, win.start_ms, win.end_ms) == ("gpu-box", "vllm", T * 1000, (T + 5) * 1000)
    (engine,) = win.engines
    model = series_values(texts[0], "vllm:num_requests_running")[0][0]["model_name"]
    assert (engine.engine, engine.model_name) == ("0", model)
    t_ms = [int(T * 1000), int((T + 5) * 1000)]

    for metric in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_hits_total",
    ]:
        assert engine.series[(metric, ())] == tuple(zip(t_ms, [value_of(x, metric) for x in texts])), metric
    length = (("finished_reason", "length"),)
    assert engine.series[("vllm:request_success_total", length)] == tuple(
        zip(t_ms, [value_of(x, "vllm:request_success_total", finished_reason="length") for x in texts])
    )

    ttft = engine.hists[("vllm:time_to_first_token_seconds", ())]
    expected = [bucket_counts(x, "vllm:time_to_first_token_seconds") for x in texts]
    assert list(ttft.bounds) == sorted(expected[0])
    assert [p.ts_ms for p in ttft.points] == t_ms
    assert [p.counts for p in ttft.points] == [tuple(e[b] for b in ttft.bounds) for e in expected]
    assert [p.count for p in ttft.points] == [value_of(x, "vllm:time_to_first_token_seconds_count") for x in texts]
    assert [p.sum for p in ttft.points] == [value_of(x, "vllm:time_to_first_token_seconds_sum") for x in texts]

    # the range includes both ends and nothing else
    assert all(len(p) == 1 for p in store.window("gpu-box", T + 0.001, T + 5).engines[0].series.values())
    assert store.target_names() == ["gpu-box"]


def test_ingesting_the_same_scrape_twice_keeps_one_point(tmp_path: Path) -> None:
    store = migrated_store(tmp_path)
    snap = _snapshot("metrics_idle.txt", T)
    store.ingest(snap)
    store.ingest(snap)
    engine = store.window("gpu-box", T - 60, T + 60).engines[0]
    assert engine.series[("vllm:num_requests_running", ())] == ((int(T * 1000), 0.0),)


def test_window_of_an_unknown_target_names_the_known_ones(tmp_path: Path) -> None:
    store = migrated_store(tmp_path)
    store.ingest(_snapshot("metrics_idle.txt", T))
    with pytest.raises(KeyError, match="unknown target 'laptop'; known targets: gpu-box"):
        store.window("laptop", T, T + 5)


# ---- health ---------------------------------------------------------------------------------------------------


def test_failures_count_up_and_a_success_resets_them(tmp_path: Path) -> None:
    store = migrated_store(tmp_path)
    store.ingest(_snapshot("metrics_idle.txt", T))
    ok = store.health("gpu-box")
    assert ok is not None
    assert (ok.health, ok.last_error, ok.consecutive_failures, ok.last_success_ms) == ("up", "", 0, T * 1000)

    for k in (1, 2):
        store.record_failure(
            "gpu-box",
            "vllm",
            "http://10.0.0.5:8000",
            T + 5 * k,
            3.0,
            "http://10.0.0.5:8000/metrics: connection refused",
        )
        down = store.health("gpu-box")
        assert down is not None
        assert (down.health, down.consecutive_failures) == ("down", k)
        assert down.last_error == "http://10.0.0.5:8000/metrics: connection refused"
        assert (down.last_scrape_ms, down.last_success_ms) == ((T + 5 * k) * 1000, T * 1000)

    store.ingest(_snapshot("metrics_idle.txt", T + 15))
    back = store.health("gpu-box")
    assert back is not None
    assert (back.health, back.consecutive_failures, back.last_error, back.last_success_ms) == (
        "up",
        0,
        "",
        (T + 15) * 1000,
    )
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT health FROM scrapes ORDER BY ts_ms")).scalars().all()
    assert rows == ["up", "down", "down", "up"]


def _written(store: Store) -> tuple[list, list, list, list]:
    with store.engine.connect() as conn:
        return tuple(
            conn.execute(text(q)).all()
            for q in (  # type: ignore[return-value]
                "SELECT t.name, s.ts_ms, s.health, s.error, s.samples FROM scrapes s JOIN targets t ON t.id = s.target_id "
                "ORDER BY s.ts_ms, t.name",
                "SELECT t.name, h.health, h.consecutive_failures, h.last_scrape_ms, h.last_success_ms, h.last_error "
                "FROM target_health h JOIN targets t ON t.id = h.target_id ORDER BY t.name",
                "SELECT r.metric, r.labels, p.ts_ms, p.value FROM samples p JOIN series r ON r.id = p.series_id "
                "ORDER BY r.metric, r.labels, p.ts_ms",
                "SELECT r.metric, p.ts_ms, p.count, p.sum, p.counts FROM hist_samples p JOIN series r ON r.id = p.series_id "
                "ORDER BY r.metric, p.ts_ms",
            )
        )


def test_a_batch_writes_what_the_same_scrapes_one_by_one_write(tmp_path: Path) -> None:
    """The daemon writes a tick's scrapes in one transaction (Store.write): the rows, health and failure
    counts must be those of writing them one at a time, a target seen twice in one batch included."""
    items: list[Scraped | Failed] = [
        Scraped(_snapshot("metrics_idle.txt", T, target="a"), "http://a"),
        Failed("b", "vllm", "http://b", T + 1, 3.0, "connection refused"),
        Failed("b", "vllm", "http://b", T + 6, 3.0, "connection refused"),
        Scraped(_snapshot("metrics_under_load.txt", T + 5, target="a"), "http://a"),
        Scraped(_snapshot("metrics_after_load.txt", T + 10, target="b"), "http://b"),
        Failed("a", "vllm", "http://a", T + 15, 1.0, "timed out"),
    ]
    one_by_one = migrated_store(tmp_path, "single.db")
    singles = [one_by_one.write([item])[0] for item in items]
    batched = migrated_store(tmp_path, "batch.db")
    assert batched.write(items) == singles
    assert _written(batched) == _written(one_by_one)
    health = {row[0]: row for row in _written(batched)[1]}
    assert health["a"][1:3] == ("down", 1) and health["b"][1:3] == ("up", 0)
    assert batched.scrapes("a") == 3 and batched.scrapes("b") == 3


def test_a_batch_the_database_refuses_writes_nothing(tmp_path: Path) -> None:
    store = migrated_store(tmp_path)
    store.write([Scraped(_snapshot("metrics_idle.txt", T, target="a"), "http://a")])
    before = _written(store)
    with store.engine.begin() as conn:  # a schema that cannot take the batch's last row
        conn.execute(
            text(
                "CREATE TRIGGER no_b BEFORE INSERT ON scrapes WHEN NEW.error = 'refuse me' "
                "BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
            )
        )
    with pytest.raises(StoreError, match="disk says no"):
        store.write(
            [
                Scraped(_snapshot("metrics_under_load.txt", T + 5, target="a"), "http://a"),
                Failed("a", "vllm", "http://a", T + 10, 1.0, "refuse me"),
            ]
        )
    assert _written(store) == before and store.scrapes("a") == 1


def test_a_scrape_with_problems_is_degraded_and_says_why(tmp_path: Path) -> None:
    store = migrated_store(tmp_path)
    snap = _snapshot("metrics_idle.txt", T)
    problems = ("line 7: vllm:kv_cache_usage_perc is nan; sample dropped", "/slots answered HTTP 501")
    store.ingest(TargetSnapshot(snap.target, snap.backend, snap.ts, snap.duration_s, snap.engines, problems))
    h = store.health("gpu-box")
    assert h is not None
    assert (h.health, h.last_error, h.consecutive_failures) == ("degraded", "; ".join(problems), 0)
    assert store.health("nobody") is None


# ---- engine config -----------------------------------------------------------------------------------------------


def _config_rows(store: Store) -> list[tuple[int, int, dict[str, str]]]:
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT first_seen_ms, last_seen_ms, config FROM engine_configs ORDER BY id"))
        return [(a, b, json.loads(c)) for a, b, c in rows]


def test_engine_config_is_stored_once_while_unchanged(tmp_path: Path) -> None:
    store = migrated_store(tmp_path)
    on, off = _snapshot("metrics_after_load.txt", T), _snapshot("metrics_prefix_caching_off.txt", T)
    assert (on.engines[0].engine, on.engines[0].model_name) == (off.engines[0].engine, off.engines[0].model_name)
    for k in range(3):
        store.ingest(_snapshot("metrics_after_load.txt", T + 5 * k))
    Store(store.engine).ingest(_snapshot("metrics_after_load.txt", T + 15))  # a restarted daemon: no cache
    rows = _config_rows(store)
    assert [(a, b) for a, b, _ in rows] == [(T * 1000, (T + 15) * 1000)]
    assert rows[0][2]["enable_prefix_caching"] == "True"

    store.ingest(_snapshot("metrics_prefix_caching_off.txt", T + 20))
    rows = _config_rows(store)
    assert [(a, b) for a, b, _ in rows] == [(T * 1000, (T + 15) * 1000), ((T + 20) * 1000, (T + 20) * 1000)]
    assert rows[1][2]["enable_prefix_caching"] == "False"
    assert store.window("gpu-box", T, T + 20).engines[0].config["enable_prefix_caching"] == "False"


# ---- retention ---------------------------------------------------------------------------------------------------

T0 = 1_699_999_800  # a multiple of 300 s, so the 5-minute rollup buckets start at T0
STEP_S = 5
N = 3 * 3600 // STEP_S  # 2160 scrapes: three hours of history
NOW = T0 + N * STEP_S
PER_BUCKET = 300 // STEP_S  # 60 scrapes per 5-minute bucket
RESET_AT = 10 * PER_BUCKET + 25  # generation_tokens restarts 25 scrapes into bucket 10 (an engine restart)
BOUNDS = (0.1, 1.0, float("inf"))


def prompt_tokens(i: int) -> float:
    return 10.0 * i  # +10 every 5 s


def generation_tokens(i: int) -> float:
    return 10.0 * i if i < RESET_AT else 10.0 * (i - RESET_AT)


def kv_usage(i: int) -> float:
    # a sawtooth of period 50 scrapes (not a divisor of the 60-scrape bucket, so buckets differ),
    # lifted by 0.1 every half hour
    return 0.1 * (i // 360) + 0.01 * (i % 50)


def ttft_counts(i: int) -> tuple[float, float, float]:
    return (float(i), 2.0 * i, 3.0 * i)


def _ts_ms(i: int) -> int:
    return (T0 + i * STEP_S) * 1000


def _history(tmp_path: Path) -> Store:
    store = migrated_store(tmp_path)
    for i in range(N):
        engine = EngineSnapshot(
            backend="vllm",
            engine="0",
            model_name="m",
            values={
                ("vllm:prompt_tokens_total", ()): prompt_tokens(i),
                ("vllm:generation_tokens_total", ()): generation_tokens(i),
                ("vllm:kv_cache_usage_perc", ()): kv_usage(i),
            },
            histograms={
                ("vllm:time_to_first_token_seconds", ()): Histogram(
                    BOUNDS, ttft_counts(i), sum=0.05 * i, count=ttft_counts(i)[-1]
                )
            },
        )
        store.ingest(TargetSnapshot("gpu-box", "vllm", T0 + i * STEP_S, 0.01, (engine,)))
    return store


RETENTION = Retention(raw=timedelta(hours=1), rollup=timedelta(days=30), rollup_step=timedelta(minutes=5))
CUTOFF_I = (NOW - 3600 - T0) // STEP_S  # first scrape index kept raw: 1440 (NOW - 1 h is on a bucket edge)
KEPT = [b * PER_BUCKET + PER_BUCKET - 1 for b in range(CUTOFF_I // PER_BUCKET)] + list(range(CUTOFF_I, N))


@dataclass
class Thinned:
    store: Store
    counts: dict[str, int]


@pytest.fixture(scope="module")
def history_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three hours of history, ingested once; each test works on its own copy of the file."""
    store = _history(tmp_path_factory.mktemp("history"))
    store.engine.dispose()  # the last connection to close checkpoints the WAL into the file
    return Path(store.engine.url.database or "")


@pytest.fixture
def thinned(history_db: Path, tmp_path: Path) -> Thinned:
    copy = tmp_path / "tuner.db"
    shutil.copyfile(history_db, copy)
    store = Store(open_engine(f"sqlite:///{copy}"))
    check_schema(store.engine)
    return Thinned(store, apply_retention(store, RETENTION, now=NOW))


def test_old_raw_points_are_thinned_to_the_last_of_each_step(thinned: Thinned) -> None:
    engine = thinned.store.window("gpu-box", T0, NOW).engines[0]
    # 24 buckets before the cutoff keep their last scrape; the last hour keeps all 720
    assert len(KEPT) == 24 + 720
    # generation_tokens also keeps the two scrapes around its reset (see the reset test below)
    kept_gen = sorted({*KEPT, RESET_AT - 1, RESET_AT})
    for metric, f, kept in [
        ("vllm:prompt_tokens_total", prompt_tokens, KEPT),
        ("vllm:generation_tokens_total", generation_tokens, kept_gen),
        ("vllm:kv_cache_usage_perc", kv_usage, KEPT),
    ]:
        assert engine.series[(metric, ())] == tuple((_ts_ms(i), f(i)) for i in kept), metric
    hist = engine.hists[("vllm:time_to_first_token_seconds", ())]
    assert hist.bounds == BOUNDS
    assert [(p.ts_ms, p.counts) for p in hist.points] == [(_ts_ms(i), ttft_counts(i)) for i in KEPT]
    # 3 plain series x (2160 - 744) points removed, less the 2 kept around the reset
    assert thinned.counts["thinned_samples"] == 3 * (N - len(KEPT)) - 2
    assert thinned.counts["thinned_hist_samples"] == N - len(KEPT)
    with thinned.store.engine.connect() as conn:  # scrape records go with the raw points
        assert conn.execute(text("SELECT COUNT(*) FROM scrapes")).scalar() == N - CUTOFF_I


def test_increase_between_kept_points_is_unchanged(thinned: Thinned) -> None:
    engine = thinned.store.window("gpu-box", T0, NOW).engines[0]
    kept = engine.series[("vllm:prompt_tokens_total", ())]
    raw = [(_ts_ms(i), prompt_tokens(i)) for i in range(N)]
    for (a, _), (b, _) in zip(kept, kept[1:]):
        inside_raw = [p for p in raw if a <= p[0] <= b]
        inside_kept = [p for p in kept if a <= p[0] <= b]
        assert increase(inside_kept, a, b) == increase(inside_raw, a, b)
    # over the whole range: 10 per scrape from the first kept scrape (59) to the last (2159)
    assert increase(kept, kept[0][0], kept[-1][0]) == 10.0 * (N - 1 - 59)

    hist = engine.hists[("vllm:time_to_first_token_seconds", ())]
    first, last = hist.points[0], hist.points[-1]
    for b in range(len(BOUNDS)):
        assert increase([(p.ts_ms, p.counts[b]) for p in hist.points], first.ts_ms, last.ts_ms) == (
            last.counts[b] - first.counts[b]
        )


def test_counter_reset_survives_thinning_exactly(thinned: Thinned) -> None:
    """Thinning keeps the scrapes on both sides of a reset, so no growth is lost around it.

    The counter restarted at scrape 625 (bucket 10). Raw samples see 5990 -> 6240 (+250), the reset
    (+6240 counted by increase), then 0 -> 340. With only each bucket's last scrape kept (599, 659),
    the +250 before the reset would be lost; keeping 624 and 625 as well makes the increase exact.
    """
    kept = thinned.store.window("gpu-box", T0, NOW).engines[0].series[("vllm:generation_tokens_total", ())]
    kept_ts = [t for t, _ in kept]
    assert _ts_ms(RESET_AT - 1) in kept_ts and _ts_ms(RESET_AT) in kept_ts
    raw = [(_ts_ms(i), generation_tokens(i)) for i in range(N)]

    whole_raw = increase(raw[59:], _ts_ms(59), _ts_ms(N - 1))
    whole_kept = increase(kept, _ts_ms(59), _ts_ms(N - 1))
    assert whole_raw is not None and whole_kept == whole_raw
    assert whole_kept > generation_tokens(N - 1)  # the reset is counted: more than the last value

    for (a, _), (b, _) in zip(kept, kept[1:]):  # every pair of kept points, the reset's included
        assert increase([p for p in kept if a <= p[0] <= b], a, b) == increase([p for p in raw if a <= p[0] <= b], a, b)


def test_gauge_rollups_hold_min_max_mean_per_step(thinned: Thinned) -> None:
    with thinned.store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT g.bucket_ms, g.min, g.max, g.sum, g.count FROM gauge_rollups g "
                "JOIN series s ON s.id = g.series_id WHERE s.metric = 'vllm:kv_cache_usage_perc' "
                "ORDER BY g.bucket_ms"
            )
        ).all()
        kinds = set(
            conn.execute(text("SELECT s.kind FROM gauge_rollups g JOIN series s ON s.id = g.series_id")).scalars()
        )
    assert kinds == {"gauge"}  # counters and histograms need no rollup: thinning keeps them exact
    assert len(rows) == CUTOFF_I // PER_BUCKET == 24
    for b, (bucket_ms, lo, hi, total, count) in enumerate(rows):
        values = [kv_usage(i) for i in range(b * PER_BUCKET, (b + 1) * PER_BUCKET)]
        assert bucket_ms == _ts_ms(b * PER_BUCKET)
        assert (lo, hi, count) == (min(values), max(values), 60)
        assert total / count == pytest.approx(sum(values) / 60)
    assert len({(r[1], r[2]) for r in rows}) > 1  # the buckets really differ


def test_retention_runs_once_per_raw_window(thinned: Thinned) -> None:
    again = apply_retention(thinned.store, RETENTION, now=NOW)
    assert "rollups" not in again and "thinned_samples" not in again
    assert all(v == 0 for v in again.values())


def test_rollup_retention_drops_the_oldest(thinned: Thinned) -> None:
    short = Retention(raw=timedelta(hours=1), rollup=timedelta(hours=2), rollup_step=timedelta(minutes=5))
    counts = apply_retention(thinned.store, short, now=NOW)
    oldest_kept_ms = (NOW - 2 * 3600) * 1000
    # buckets 0-11 (the first hour) go: one kept scrape each per plain series / histogram, one rollup
    # each, and the two scrapes kept around the reset in bucket 10
    assert counts["dropped_samples"] == 3 * 12 + 2
    assert counts["dropped_hist_samples"] == 12
    assert counts["dropped_gauge_rollups"] == 12
    engine = thinned.store.window("gpu-box", T0, NOW).engines[0]
    points = engine.series[("vllm:prompt_tokens_total", ())]
    assert points[0] == (_ts_ms(12 * PER_BUCKET + PER_BUCKET - 1), prompt_tokens(12 * PER_BUCKET + PER_BUCKET - 1))
    assert all(ts >= oldest_kept_ms for ts, _ in points)
    with thinned.store.engine.connect() as conn:
        assert conn.execute(text("SELECT MIN(bucket_ms) FROM gauge_rollups")).scalar() == oldest_kept_ms


def test_the_migrations_build_exactly_the_schema_the_models_declare(tmp_path):
    """Every table, column and index of the models, as the Alembic scripts create them (hand-written scripts drift)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    import tuner.store.alerts  # noqa: F401  (each registers its tables on Base)
    import tuner.store.journal  # noqa: F401
    import tuner.store.recommendations  # noqa: F401
    import tuner.store.tuning  # noqa: F401
    from tuner.store.models import Base

    engine = open_engine(f"sqlite:///{tmp_path / 'm.db'}")
    upgrade(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_a_window_longer_than_the_raw_span_is_read_as_retention_will_keep_it(tmp_path: Path) -> None:
    """A window longer than ``retention.raw`` is read at the rollup step (the points retention marked): it must
    equal the plain read of the same history once apply_retention has thinned all of it (a counter and a
    histogram reset included), hold the points around each reset, read steps not marked yet point by point,
    and end at the window's last point; a window within the raw span reads every point."""

    def ttft(i: int) -> tuple[float, float, float]:  # the histogram restarts with the counter
        return ttft_counts(i if i < RESET_AT else i - RESET_AT)

    store = migrated_store(tmp_path, "a.db")
    for i in range(N):
        engine = EngineSnapshot(
            backend="vllm",
            engine="0",
            model_name="m",
            values={
                ("vllm:generation_tokens_total", ()): generation_tokens(i),
                ("vllm:kv_cache_usage_perc", ()): kv_usage(i),
            },
            histograms={
                ("vllm:time_to_first_token_seconds", ()): Histogram(BOUNDS, ttft(i), sum=0.05 * i, count=ttft(i)[-1])
            },
        )
        store.ingest(TargetSnapshot("gpu-box", "vllm", T0 + i * STEP_S, 0.01, (engine,)))
    store.engine.dispose()
    for name in ("b.db", "c.db"):
        shutil.copyfile(tmp_path / "a.db", tmp_path / name)
    reading = Store(open_engine(f"sqlite:///{tmp_path / 'a.db'}"), retention=RETENTION)
    apply_retention(reading, RETENTION, now=NOW + 300)  # every step marked; the last 55 minutes kept raw
    aged = Store(open_engine(f"sqlite:///{tmp_path / 'b.db'}"))
    apply_retention(aged, RETENTION, now=NOW + 3600)  # everything older than the raw span now

    long = reading.window("gpu-box", T0, NOW)
    assert long == aged.window("gpu-box", T0, NOW)
    e = long.engines[0]
    gen = [t for t, _ in e.series[("vllm:generation_tokens_total", ())]]
    hist = [p.ts_ms for p in e.hists[("vllm:time_to_first_token_seconds", ())].points]
    steps = [_ts_ms(b * PER_BUCKET + PER_BUCKET - 1) for b in range(N // PER_BUCKET)]
    assert gen == hist == sorted({*steps, _ts_ms(RESET_AT - 1), _ts_ms(RESET_AT)})
    assert [t for t, _ in e.series[("vllm:kv_cache_usage_perc", ())]] == steps
    raw_gen = [(_ts_ms(i), generation_tokens(i)) for i in range(N)]
    assert increase(e.series[("vllm:generation_tokens_total", ())], _ts_ms(PER_BUCKET - 1), _ts_ms(N - 1)) == increase(
        raw_gen[PER_BUCKET - 1 :], _ts_ms(PER_BUCKET - 1), _ts_ms(N - 1)
    )

    short = reading.window("gpu-box", NOW - 3000, NOW)  # within the raw span: every point
    assert len(short.engines[0].series[("vllm:kv_cache_usage_perc", ())]) == 3000 // STEP_S

    end = T0 + 1800 * STEP_S + 2  # in a marked step, on raw points: the window still ends at its last point
    kv = reading.window("gpu-box", T0, end).engines[0].series[("vllm:kv_cache_usage_perc", ())]
    assert [t for t, _ in kv] == [t for t in steps if t <= end * 1000] + [_ts_ms(1800)]

    behind = Store(open_engine(f"sqlite:///{tmp_path / 'c.db'}"), retention=RETENTION)
    apply_retention(behind, RETENTION, now=NOW - 1800 + 300)  # marks stop half an hour before the end
    kv = behind.window("gpu-box", T0, NOW).engines[0].series[("vllm:kv_cache_usage_perc", ())]
    cut = _ts_ms(N - 1800 // STEP_S)
    assert [t for t, _ in kv] == [t for t in steps if t < cut] + [_ts_ms(i) for i in range(N - 1800 // STEP_S, N)]


def test_the_keep_migration_marks_what_earlier_thinning_kept(tmp_path: Path) -> None:
    """0006 adds ``keep``: points older than the last thinning are the survivors (marked), newer raw points
    wait for retention to mark them; the tables stay WITHOUT ROWID."""
    engine = open_engine(f"sqlite:///{tmp_path / 'm.db'}")
    upgrade(engine, "0005")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO targets (id, name, backend, url, labels) VALUES (1, 't', 'vllm', '', '{}')"))
        conn.execute(
            text(
                "INSERT INTO series (id, target_id, engine, model_name, metric, labels, kind, bounds) "
                "VALUES (1, 1, '0', 'm', 'a_total', '[]', 'counter', ''), "
                "(2, 1, '0', 'm', 'h', '[]', 'histogram', '[1.0, \"+Inf\"]')"
            )
        )
        for ts in (1000, 2000, 3000):
            conn.execute(text("INSERT INTO samples (series_id, ts_ms, value) VALUES (1, :t, 1.0)"), {"t": ts})
            conn.execute(
                text(
                    "INSERT INTO hist_samples (series_id, ts_ms, count, sum, counts) "
                    "VALUES (2, :t, 1.0, 1.0, '[1.0, 1.0]')"
                ),
                {"t": ts},
            )
        conn.execute(text("INSERT INTO meta (key, value) VALUES ('thinned_until_ms', '2500')"))
    upgrade(engine)
    with engine.connect() as conn:
        for table in ("samples", "hist_samples"):
            assert conn.execute(text(f"SELECT ts_ms, keep FROM {table} ORDER BY ts_ms")).all() == [
                (1000, 1),
                (2000, 1),
                (3000, 0),
            ]
            assert (
                "WITHOUT ROWID"
                in conn.execute(text("SELECT sql FROM sqlite_master WHERE name = :n"), {"n": table}).scalar()
            )


def test_each_scrape_stores_its_own_values_whatever_changed_in_its_series(tmp_path: Path) -> None:
    """The store remembers an engine's series ids in its last scrape's order (a scrape of the same shape skips the
    key lookups). Every scrape's rows, read back from SQLite, are that scrape's values, bucket counts, sums and
    counts, through a series added and one gone, the same keys in another order, a histogram's buckets changed,
    and back to the first shape."""
    from dataclasses import replace

    from tuner.store.counts import decode_counts

    store = migrated_store(tmp_path)
    base = _snapshot("metrics_under_load.txt", T)
    (e,) = base.engines
    (hkey, h), *_ = e.histograms.items()
    (vkey, _), *_ = e.values.items()
    added = dict(e.values)
    del added[vkey]
    added[("vllm:num_requests_waiting", (("extra", "x"),))] = 7.0
    reordered = dict(reversed(list(e.values.items())))
    rebucketed = {
        **e.histograms,
        hkey: Histogram(
            bounds=h.bounds[:-2] + (h.bounds[-1],), counts=h.counts[:-2] + (h.counts[-1],), sum=h.sum, count=h.count
        ),
    }
    shapes = [
        e,
        replace(e, values={k: v + 1 for k, v in e.values.items()}),
        replace(e, values=added),
        replace(e, values=reordered),
        replace(e, values=reordered, histograms=rebucketed),
        replace(e, values=reordered),
        replace(e, values={k: v + 2 for k, v in e.values.items()}),
    ]
    for i, engine in enumerate(shapes):
        ts = T + 5 * i
        store.ingest(replace(base, ts=ts, engines=(engine,)))
        with store.engine.connect() as conn:
            values = {
                (r.metric, r.labels): r.value
                for r in conn.execute(
                    text(
                        "SELECT s.metric, s.labels, p.value FROM samples p JOIN series s ON s.id = p.series_id "
                        "WHERE p.ts_ms = :ts"
                    ),
                    {"ts": int(ts * 1000)},
                )
            }
            hists = {
                (r.metric, r.labels, r.bounds): (r.count, r.sum, r.counts)
                for r in conn.execute(
                    text(
                        "SELECT s.metric, s.labels, s.bounds, p.count, p.sum, p.counts FROM hist_samples p "
                        "JOIN series s ON s.id = p.series_id WHERE p.ts_ms = :ts"
                    ),
                    {"ts": int(ts * 1000)},
                )
            }
        assert values == {(m, json.dumps(lbl)): v for (m, lbl), v in engine.values.items()}, i
        want = {
            (m, json.dumps(lbl), json.dumps([b if b != float("inf") else "+Inf" for b in x.bounds])): (
                x.count,
                x.sum,
                x.counts,
            )
            for (m, lbl), x in engine.histograms.items()
        }
        assert {k: (c, s, decode_counts(counts, len(want[k][2]))) for k, (c, s, counts) in hists.items()} == want, i


def test_the_target_order_migration_keeps_every_point_and_downgrades_back(tmp_path: Path) -> None:
    """0007 puts samples and hist_samples in (target, time, series) order: every row comes through with its
    series' target, a window reads the same points from them, and the downgrade gives back the rows it had."""
    engine = open_engine(f"sqlite:///{tmp_path / 'm.db'}")
    upgrade(engine, "0006")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO targets (id, name, backend, url, labels) VALUES "
                "(1, 'a', 'vllm', '', '{}'), (2, 'b', 'vllm', '', '{}')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO series (id, target_id, engine, model_name, metric, labels, kind, bounds) VALUES "
                "(1, 2, '0', 'm', 'vllm:num_requests_running', '[]', 'gauge', ''), "
                "(2, 1, '0', 'm', 'vllm:num_requests_running', '[]', 'gauge', ''), "
                "(3, 1, '0', 'm', 'vllm:e2e_request_latency_seconds', '[]', 'histogram', "
                "'[1.0, \"+Inf\"]')"
            )
        )
        for i, ts in enumerate((5000, 1000, 3000)):  # inserted out of order
            conn.execute(
                text("INSERT INTO samples (series_id, ts_ms, value, keep) VALUES (1, :t, :v, :k), (2, :t, :w, 0)"),
                {"t": ts, "v": float(i), "w": 10.0 + i, "k": i % 2},
            )
            conn.execute(
                text(
                    "INSERT INTO hist_samples (series_id, ts_ms, count, sum, counts, keep) "
                    "VALUES (3, :t, :c, 0.5, :counts, 1)"
                ),
                {"t": ts, "c": float(i), "counts": f"[{i}.0, {i}.0]"},
            )
    with engine.connect() as conn:
        before = {
            t: conn.execute(text(f"SELECT * FROM {t} ORDER BY series_id, ts_ms")).all()
            for t in ("samples", "hist_samples")
        }
    upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(
            text("SELECT target_id, series_id, ts_ms, value, keep FROM samples ORDER BY series_id, ts_ms")
        ).all() == [
            (2, 1, 1000, 1.0, 1),
            (2, 1, 3000, 2.0, 0),
            (2, 1, 5000, 0.0, 0),
            (1, 2, 1000, 11.0, 0),
            (1, 2, 3000, 12.0, 0),
            (1, 2, 5000, 10.0, 0),
        ]
        assert conn.execute(
            text("SELECT target_id, series_id, ts_ms, count, counts FROM hist_samples ORDER BY ts_ms")
        ).all() == [(1, 3, 1000, 1.0, "[1.0, 1.0]"), (1, 3, 3000, 2.0, "[2.0, 2.0]"), (1, 3, 5000, 0.0, "[0.0, 0.0]")]
        for table in ("samples", "hist_samples"):
            assert (
                "WITHOUT ROWID"
                in conn.execute(text("SELECT sql FROM sqlite_master WHERE name = :n"), {"n": table}).scalar()
            )
    w = Store(engine).window("a", 0.0, 10.0)
    (e,) = w.engines
    assert [(ts, v) for ts, v in e.series[("vllm:num_requests_running", ())]] == [
        (1000, 11.0),
        (3000, 12.0),
        (5000, 10.0),
    ]
    assert [p.ts_ms for p in e.hists[("vllm:e2e_request_latency_seconds", ())].points] == [1000, 3000, 5000]
    from alembic import command

    from tuner.store.db import _alembic_config

    cfg = _alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0006")
    with engine.connect() as conn:
        assert {
            t: conn.execute(text(f"SELECT * FROM {t} ORDER BY series_id, ts_ms")).all()
            for t in ("samples", "hist_samples")
        } == before
