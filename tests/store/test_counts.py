"""Histogram rows' bucket counts (tuner/store/counts.py): exact round trips, old JSON rows read the same, and the
compiled encoder (collect/_numbers.c) writes what the Python one writes."""

from __future__ import annotations

import json
import math
import random
import sqlite3
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import both_ways, migrated_store, store_recorded_history
from tuner.config import Slo
from tuner.store import counts as counts_module
from tuner.store.counts import decode_counts, encode_counts, encode_counts_python

_encoder = both_ways(counts_module)  # each test with the compiled encoder and with Python's


def _same(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


def _cases() -> list[tuple[float, ...]]:
    rng = random.Random(7)
    cases: list[tuple[float, ...]] = [
        (),
        (0.0,),
        (0.0, 0.0, 0.0),
        (5.0,),
        (0.0, 0.0, 3.0, 11.0, 13.0, 13.0, 13.0),
        (2.0**53 - 1, 2.0**53 - 1),
        (2.0**53, 2.0**53),
        (1e300,),
        (-0.0, 1.0),
        (3.0, 2.0, 1.0),
        (-4.0, -1.0),
        (0.5, 1.5),
        (float("nan"), 1.0),
        (1.0, float("inf")),
        (float("-inf"), 0.0),
        (1.0, 1.0000000000000002),
    ]
    for _ in range(300):  # cumulative whole counts, as servers export them, of every size
        n = rng.randint(1, 40)
        scale = 10 ** rng.randint(0, 15)
        cum = list(accumulate_ints(rng.randint(0, 3) and rng.randint(0, scale) for _ in range(n)))
        cases.append(tuple(float(c) for c in cum))
    for _ in range(100):  # anything else floats can be
        cases.append(
            tuple(
                rng.choice((rng.uniform(-1e6, 1e6), float(rng.randint(-9, 9)), rng.random()))
                for _ in range(rng.randint(1, 12))
            )
        )
    return cases


def accumulate_ints(xs):  # type: ignore[no-untyped-def]
    total = 0
    for x in xs:
        total += x
        yield total


@pytest.mark.parametrize("counts", _cases())
def test_the_compiled_encoder_writes_what_python_writes(counts: tuple[float, ...]) -> None:
    assert encode_counts(counts) == encode_counts_python(counts)


_COUNT = st.one_of(
    st.integers(-(2**54), 2**54).map(float),
    st.floats(),
    st.integers(0, 10**6).map(float),
    st.sampled_from([0.0, -0.0, 2.0**53, 2.0**53 - 1, -(2.0**53 - 1), 0.5]),
)


@settings(max_examples=3000, derandomize=True, database=None, deadline=None)
@given(st.lists(_COUNT, max_size=60).map(tuple))
def test_any_counts_encode_as_python_encodes_them(counts: tuple[float, ...]) -> None:
    assert encode_counts(counts) == encode_counts_python(counts)


@pytest.mark.parametrize("counts", _cases())
def test_every_count_vector_comes_back_exactly(counts: tuple[float, ...]) -> None:
    text = encode_counts(counts)
    assert _same(decode_counts(text, len(counts)), counts), text
    whole = all(math.isfinite(c) and c == int(c) and abs(c) < 2**53 for c in counts)
    assert text.startswith("[") is not whole  # the compact form exactly when it is exact


def test_the_compact_form_is_the_increments_without_trailing_zeros() -> None:
    assert encode_counts((0.0, 0.0, 3.0, 11.0, 13.0, 13.0, 13.0)) == "0,0,3,8,2"
    assert encode_counts((0.0, 0.0)) == ""
    assert decode_counts("", 3) == (0.0, 0.0, 0.0)
    assert decode_counts("0,0,3,8,2", 7) == (0.0, 0.0, 3.0, 11.0, 13.0, 13.0, 13.0)


@pytest.mark.parametrize("legacy", ["[0.0, 0.0, 3.0, 11.0]", "[0.0,0.0,3.0,11.0]", json.dumps([0, 0, 3, 11])])
def test_rows_written_as_json_read_as_before(legacy: str) -> None:
    assert decode_counts(legacy, 4) == (0.0, 0.0, 3.0, 11.0)
    assert _same(decode_counts(json.dumps([float("nan"), float("inf")]), 2), (float("nan"), float("inf")))


def test_a_store_of_json_rows_and_one_of_compact_rows_give_the_same_windows_and_signals(tmp_path) -> None:
    """The same recorded history stored as today's rows and rewritten as the JSON lists every older row holds:
    windows and signals must be equal, and the compact rows smaller."""
    from tuner.signals.derive import compute_signals
    from tuner.store.db import open_engine
    from tuner.store.store import Store

    store = migrated_store(tmp_path)
    end = store_recorded_history(
        store,
        1_700_000_000.0,
        ("metrics_idle.txt", "metrics_under_load.txt", "metrics_kv_pressure.txt", "metrics_after_load.txt"),
    )
    db = store.engine.url.database
    assert db
    store.engine.dispose()
    old_db = tmp_path / "as-json.db"
    with sqlite3.connect(db) as src, sqlite3.connect(old_db) as dst:
        src.backup(dst)
    with sqlite3.connect(old_db) as con:
        rows = con.execute(
            "SELECT h.series_id, h.ts_ms, h.counts, r.bounds FROM hist_samples h JOIN series r ON r.id = h.series_id"
        ).fetchall()
        assert rows and not any(c.startswith("[") for _, _, c, _ in rows)
        con.executemany(
            "UPDATE hist_samples SET counts = ? WHERE series_id = ? AND ts_ms = ?",
            [(json.dumps(decode_counts(c, len(json.loads(b)))), sid, ts) for sid, ts, c, b in rows],
        )
    with sqlite3.connect(db) as con:
        new_bytes = con.execute("SELECT SUM(LENGTH(counts)) FROM hist_samples").fetchone()[0]
    with sqlite3.connect(old_db) as con:
        old_bytes = con.execute("SELECT SUM(LENGTH(counts)) FROM hist_samples").fetchone()[0]
    assert new_bytes < old_bytes / 2

    new, old = Store(open_engine(f"sqlite:///{db}")), Store(open_engine(f"sqlite:///{old_db}"))
    slo = Slo(ttft_p99=timedelta(seconds=0.5), itl_p99=timedelta(seconds=0.05), e2e_p99=timedelta(seconds=4))
    for target in ("v", "l"):
        for span in (30, 120, 600):
            a, b = new.window(target, end - span, end), old.window(target, end - span, end)
            assert a == b
            assert sum(len(h.points) for e in a.engines for h in e.hists.values()) > 0 or target == "l"
            assert sum(len(p) for e in a.engines for p in e.series.values()) > 0
            assert compute_signals(a, slo=slo) == compute_signals(b, slo=slo)
