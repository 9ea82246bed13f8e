"""The store's in-memory head (tuner/store/head.py) against SQLite: the same windows, the same signals.

One store writes with the head on; a second Store over the same file, without one, reads every window from SQLite.
The history is recorded vLLM and llama-server expositions with counters advancing, and everything the head keeps
track of happening in it: counter resets and histogram buckets falling (a server restart), a series appearing
on a held target, a histogram's bucket layout changing, a scrape older than the newest (a clock stepped back), a
write rolled back, failed scrapes, /health answers and a config change (the target's health and configs, which
the store keeps beside the head), and long enough for the head to trim itself.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.helpers import LLAMA_DIR, VLLM_DIR, migrated_store
from tuner.collect import llamacpp, vllm
from tuner.collect.llamacpp import parse_slots
from tuner.collect.snapshots import Histogram, TargetSnapshot
from tuner.config import Slo
from tuner.errors import StoreError
from tuner.lab.replay import ReplayExposition
from tuner.signals.derive import SIGNAL_METRICS, compute_signals
from tuner.store.db import open_engine
from tuner.store.store import Failed, Scraped, Store
from tuner.store.window import HistPoints, Points, TargetWindow

T = 1_700_000_000.0
SLO = Slo(ttft_p99="500ms", itl_p99="100ms", e2e_p99="5s")


def _plain(w: TargetWindow) -> list:
    """A window as plain values: every point of every series as tuples."""
    return [
        (
            e.engine,
            e.model_name,
            dict(e.config),
            {k: tuple(p) for k, p in e.series.items()},
            {k: (h.bounds, tuple(h.points)) for k, h in e.hists.items()},
        )
        for e in w.engines
    ] + [w.health]


class _History:
    """Recorded scrapes, 5 s apart, of vLLM target "v" and llama-server target "l", with events at given steps."""

    def __init__(self) -> None:
        self.vllm = [
            ReplayExposition((VLLM_DIR / f).read_text(), growth=0.05)
            for f in ("metrics_under_load.txt", "metrics_idle.txt")
        ]
        self.llama = ReplayExposition((LLAMA_DIR / "metrics_mid_load.txt").read_text(), growth=0.05)
        self.slots = parse_slots((LLAMA_DIR / "slots_mid_load.json").read_bytes())

    def scrape(self, step: int, ts: float) -> list[TargetSnapshot]:
        # Steps 0-59 under load; at 60 the server restarts (the idle recording: every counter and bucket lower).
        replay = self.vllm[0] if step < 60 else self.vllm[1]
        snap = vllm.snapshot_from_text(replay.render().decode(), target="v", ts=ts)
        e = snap.engines[0]
        values, hists = dict(e.values), dict(e.histograms)
        if step >= 40:  # a series appears on a target the head holds
            values[("vllm:request_success_total", (("finished_reason", "timeout"),))] = float(step)
        if step >= 90:  # the TTFT histogram's buckets change layout
            key = ("vllm:time_to_first_token_seconds", ())
            h = hists[key]
            hists[key] = Histogram((0.0025, *h.bounds[1:]), h.counts, h.sum, h.count)
        if step == 30:  # one bucket counter of the ITL histogram falls alone (and is back at the next scrape)
            key = ("vllm:inter_token_latency_seconds", ())
            h = hists[key]
            counts = list(h.counts)
            counts[8] = counts[7] = counts[6] = 0.0
            hists[key] = Histogram(h.bounds, tuple(counts), h.sum, h.count)
        config = dict(e.config)
        if step >= 80:  # the engine restarted with another config: the newest is the window's
            config["gpu_memory_utilization"] = "0.85"
        healthy = True if 45 <= step < 50 else False if step == 50 else None  # /health asked, then not (None)
        snap = replace(snap, engines=(replace(e, values=values, histograms=hists, config=config),), healthy=healthy)
        llama = llamacpp.snapshot_from_text(self.llama.render().decode(), target="l", ts=ts, slots=self.slots)
        return [snap, llama]


def _stores(tmp_path: Path) -> tuple[Store, Store]:
    sql = migrated_store(tmp_path)
    mem = Store(open_engine(f"sqlite:///{tmp_path / 'tuner.db'}"))
    mem.keep_head(SIGNAL_METRICS)
    return mem, sql


def _same(mem: Store, sql: Store, target: str, now: float, window_s: float) -> TargetWindow:
    got = mem.window(target, now - window_s, now, metrics=SIGNAL_METRICS)
    want = sql.window(target, now - window_s, now, metrics=SIGNAL_METRICS)
    assert _plain(got) == _plain(want), (target, now, window_s)
    assert compute_signals(got, slo=SLO) == compute_signals(want, slo=SLO), (target, now, window_s)
    cut = got.since(int((now - 60) * 1000))  # the signal book's shorter windows: the longest one cut down
    assert compute_signals(cut, slo=SLO) == compute_signals(
        sql.window(target, now - 60, now, metrics=SIGNAL_METRICS), slo=SLO
    ), (target, now, "cut")
    return got


def got_v(mem: Store, now: float):
    return mem.window("v", now - 60, now, metrics=SIGNAL_METRICS).engines[0]


def test_head_windows_and_signals_equal_sqlites_over_a_recorded_history(tmp_path: Path) -> None:
    mem, sql = _stores(tmp_path)
    history = _History()
    head = mem._head
    assert head is not None
    for step in range(130):
        ts = T + 5 * step
        if step == 100:  # a clock stepped back: a scrape older than the newest
            mem.write([Scraped(s) for s in history.scrape(step, ts - 12.5)])
        items: list[Scraped | Failed] = [Scraped(s) for s in history.scrape(step, ts)]
        if 70 <= step < 73:  # "v" down for three scrapes: its failures count up, its last success stands
            items[0] = Failed("v", "vllm", "", ts, 3.0, "connection refused")
        if step == 71:  # /health answered 200 while /metrics did not (a stuck llama-server loop): kept while down
            items[0] = Failed("v", "vllm", "", ts, 3.0, "timed out", healthy=True)
        mem.write(items)
        now = ts + 2.5
        for target in ("v", "l"):
            for window_s in (300.0, 60.0):
                got = _same(mem, sql, target, now, window_s)
            assert got.engines, (target, step)
        if step in (70, 71, 72):
            h = mem.window("v", now - 60, now).health
            assert h is not None and h.health == "down" and h.server_healthy is (True if step == 71 else None), step
        # What fell, the head knew: a bucket falling alone, and the restart's counter resets.
        if step == 33:
            itl = got_v(mem, now).hists[("vllm:inter_token_latency_seconds", ())].points
            assert isinstance(itl, HistPoints) and [f[0] for f in itl.falls] == [int((T + 5 * 30) * 1000)]
        if step == 65:
            tokens = got_v(mem, now).series[("vllm:generation_tokens_total", ())]
            assert isinstance(tokens, Points) and [f[0] for f in tokens.falls] == [int((T + 5 * 60) * 1000)]
    # The head answered, and from memory: filled once per target, and again after the stepped-back scrape only.
    assert head.fills == 2 + 2, head.fills
    assert head.served == 130 * 2 * 2 + 2
    # It trimmed itself: the 5-minute windows and a margin, not the 130 scrapes.
    held = head._targets["v"]
    assert all(len(s.ts) <= (300 + 3 * 60) / 5 + 1 for s in held.series.values())
    assert held.held_from > int(T * 1000)


def test_a_rolled_back_write_empties_the_head_and_the_next_window_refills_it(tmp_path: Path) -> None:
    mem, sql = _stores(tmp_path)
    history = _History()
    for step in range(20):
        mem.write([Scraped(s) for s in history.scrape(step, T + 5 * step)])
        _same(mem, sql, "v", T + 5 * step + 1, 300.0)
    assert mem._head is not None and mem._head.fills == 1
    with sql.engine.begin() as conn:  # a trigger that fails the next write of samples
        conn.execute(text("CREATE TRIGGER fail BEFORE INSERT ON samples BEGIN SELECT RAISE(ABORT, 'disk full'); END"))
    with pytest.raises(StoreError, match="disk full"):
        mem.write([Scraped(s) for s in history.scrape(20, T + 100)])
    assert not mem._head.covers("v", int((T + 100 - 300) * 1000))
    with sql.engine.begin() as conn:
        conn.execute(text("DROP TRIGGER fail"))
    for step in range(21, 30):
        mem.write([Scraped(s) for s in history.scrape(step, T + 5 * step)])
        _same(mem, sql, "v", T + 5 * step + 1, 300.0)
    assert mem._head.fills == 2


def test_a_window_far_in_the_past_is_read_from_sqlite_and_not_held(tmp_path: Path) -> None:
    mem, sql = _stores(tmp_path)
    history = _History()
    mem.write([Scraped(s) for s in history.scrape(0, T)])
    mem.write([Scraped(s) for s in history.scrape(1, T + 5)])
    mem.write([Scraped(s) for s in history.scrape(2, T + 7200)])  # two hours later
    old = _same(mem, sql, "v", T + 10, 60.0)
    assert old.engines and mem._head is not None
    assert mem._head.fills == 0 and mem._head.served == 0  # not held: the head keeps the newest minutes only
    _same(mem, sql, "v", T + 7201, 300.0)
    assert mem._head.fills == 1


def test_increases_from_the_heads_falls_equal_a_pass_over_every_point_bit_for_bit() -> None:
    """Random series with restarts, single falling buckets and odd values (NaN, -0.0, ±Inf), fed to the head's
    series and cut to random windows: increase and bucket_increase from first, last and falls give what a pass
    over every point gives (the same points as SQLite returns them: counts through their stored encoding)."""
    import math
    import random

    from tuner.signals.promql import bucket_increase, increase
    from tuner.store.counts import encode_counts
    from tuner.store.head import SeriesInfo, _Hist, _Plain
    from tuner.store.window import HistPoint, HistSeries

    rng = random.Random(11)
    bounds = (0.1, 0.5, 1.0, 5.0, math.inf)
    falls = 0
    for case in range(400):
        plain = _Plain(SeriesInfo(1, "0", "m", "c_total", (), None))
        hist = _Hist(SeriesInfo(2, "0", "m", "h", (), bounds))
        counts, value, ts = [0.0] * len(bounds), 0.0, 1_000_000
        for _ in range(rng.choice([1, 2, 3, 12, 60])):
            r = rng.random()
            if r < 0.05:  # a restart
                counts, value = [0.0] * len(bounds), 0.0
            elif r < 0.08:  # one bucket falls alone
                k = rng.randrange(len(bounds) - 1)
                counts[k] = max(0.0, counts[k] - rng.randint(1, 5))
            elif r < 0.09:
                counts = [rng.choice([-1.0, -0.0, math.nan, math.inf]) for _ in bounds]
                value = rng.choice([-1.0, -0.0, 0.5])
            else:
                add = [rng.randint(0, 3) for _ in bounds]
                counts = [c + sum(add[: i + 1]) for i, c in enumerate(counts)]
                value += rng.randint(0, 50)
            plain.add(ts, value)
            hist.add(ts, counts[-1], 0.0, encode_counts(tuple(counts)), tuple(counts))
            ts += rng.choice([1000, 5000, 5000, 15000])
        for _ in range(3):
            lo = 1_000_000 + rng.randint(-30000, max(0, ts - 1_000_000))
            hi = rng.randint(lo, ts + 30000)
            pts, hpts = plain.view(lo, hi), hist.view(lo, hi)
            if pts is None or hpts is None:
                continue
            falls += bool(pts.falls) + bool(hpts.falls)
            assert repr(increase(pts, lo, hi)) == repr(increase(tuple(pts), lo, hi)), case
            want = bucket_increase(
                HistSeries(bounds, tuple(HistPoint(p.ts_ms, p.counts, p.sum, p.count) for p in hpts)), lo, hi
            )
            got = bucket_increase(HistSeries(bounds, hpts), lo, hi)
            assert repr(got) == repr(want), case
    assert falls > 50  # the corpus holds falls in the windows


def test_each_metric_is_kept_for_the_longest_window_asked_of_it_and_reads_the_same_as_sqlite(tmp_path: Path) -> None:
    """The signal book's reads at every tick: 10 minutes of goodput's and the restart's series (metrics_for), 5
    minutes of every series. The head keeps the 10-minute series 10 minutes and the rest 5 (each with its margin),
    every window equal to SQLite's, and is filled from SQLite once: the shorter-kept series are never asked for
    longer than they are kept. A metric no window asked of is kept no longer than the margin."""
    from tuner.signals.derive import metrics_for

    mem, sql = _stores(tmp_path)
    history = _History()
    long = metrics_for({"goodput_ratio", "restarts"})
    for step in range(200):  # 1,000 s of scrapes, 5 s apart; the restart at step 60, a new series at 40
        ts = T + 5 * step
        items: list[Scraped | Failed] = [Scraped(s) for s in history.scrape(step, ts)]
        if 70 <= step < 73:  # "v" down for three scrapes: its failures count up, its last success stands
            items[0] = Failed("v", "vllm", "", ts, 3.0, "connection refused")
        if step == 71:  # /health answered 200 while /metrics did not (a stuck llama-server loop): kept while down
            items[0] = Failed("v", "vllm", "", ts, 3.0, "timed out", healthy=True)
        mem.write(items)
        now = ts + 2.5
        for window_s, metrics in ((600.0, long), (300.0, SIGNAL_METRICS)):
            got = mem.window("v", now - window_s, now, metrics=metrics)
            assert _plain(got) == _plain(sql.window("v", now - window_s, now, metrics=metrics)), (step, window_s)
            assert compute_signals(got, slo=SLO, only={"goodput_ratio", "restarts"}) == compute_signals(
                sql.window("v", now - window_s, now, metrics=metrics), slo=SLO, only={"goodput_ratio", "restarts"}
            )
    head = mem._head
    assert head is not None and head.fills == 1, head.fills  # never refilled: what was asked was held
    held = head._targets["v"]
    newest = int((T + 5 * 199) * 1000)
    for s in held.series.values():
        if not s.ts:  # the TTFT histogram's series of its old bucket layout (before step 90): nothing left
            continue
        kept_s = (newest - s.ts[0]) / 1000
        # (the TTFT histogram's new layout has existed since step 90 only: 545 s)
        at_least = 545 if s.info.metric == "vllm:time_to_first_token_seconds" else 600
        if s.info.metric in long:
            assert at_least <= kept_s <= 600 + 3 * 15 + 5, (s.info.metric, kept_s)
        else:
            assert 300 <= kept_s <= 300 + 3 * 15 + 5, (s.info.metric, kept_s)
    # a metric asked for 10 minutes once more is still held 5 minutes back only: read from SQLite and refilled
    counters = frozenset(["vllm:generation_tokens_total"])
    now = T + 5 * 199 + 2.5
    assert not head.covers("v", int((now - 600) * 1000), counters)
    assert _plain(mem.window("v", now - 600, now, metrics=counters)) == _plain(
        sql.window("v", now - 600, now, metrics=counters)
    )
    assert head.fills == 2 and head.covers("v", int((now - 600) * 1000), counters)
