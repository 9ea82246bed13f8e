"""Signals once per tick per target: the daemon's exporter and its alert rules read the same derived figures."""

from __future__ import annotations

from tuner.collect.snapshots import EngineSnapshot, TargetSnapshot
from tuner.config import parse_config
from tuner.daemon import Daemon
from tuner.signals.derive import compute_signals

T0 = 1_800_000_000.0
# One rule over the daemon's signal window (shared with the exporter), one over a longer window (its own).
RULES = """\
groups:
  - name: g
    interval: 15s
    rules:
      - {alert: KVHigh, signal: kv_cache_usage, op: ">", threshold: 0.9, window: 5m, for: 0s}
      - {alert: KVHighLong, signal: kv_cache_usage, op: ">", threshold: 0.9, window: 30m, for: 0s}
"""


def _scrape(store, ts: float, kv: float) -> None:
    e = EngineSnapshot(
        backend="vllm", engine="0", model_name="m", values={("vllm:kv_cache_usage_perc", ()): kv}, histograms={}
    )
    store.ingest(TargetSnapshot(target="chat", backend="vllm", ts=ts, duration_s=0.0, engines=(e,)))


def test_the_exporter_and_the_rules_share_one_derivation_per_scrape(tmp_path, store):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    cfg = parse_config(
        "targets:\n  - {name: chat, backend: vllm, url: 'http://127.0.0.1:1'}\n"
        "defaults: {scrape_interval: 5s, signal_window: 5m}\n"
        f"alerting: {{rule_files: ['{rules}']}}\n"
    )
    now = [T0]
    daemon = Daemon(cfg, store, clock=lambda: now[0])
    calls: list[str] = []

    def derive(window, *, slo=None, only=None):  # the real derivation, counted
        calls.append(window.target)
        return compute_signals(window, slo=slo, only=only)

    daemon.signals._derive = derive
    _scrape(store, T0 - 5, 0.95)
    _scrape(store, T0, 0.97)

    daemon.signals_once()  # the exporter's view: one derivation over the 5 m window
    daemon.rules.evaluate_once("g")  # the 5 m rule reuses it; the 30 m rule derives its own window once
    assert len(calls) == 2
    shared = daemon.state.signals["chat"]
    assert daemon.signals.get("chat", 300.0, now[0]) is shared
    assert sorted(a.labels["alertname"] for a in daemon.alerting.active()) == ["KVHigh", "KVHighLong"]
    assert all(a.state == "firing" for a in daemon.alerting.active())

    # Within the tick (no new scrape, less than a scrape interval later) nothing is derived again.
    now[0] = T0 + 2
    daemon.rules.evaluate_once("g")
    daemon.signals_once()
    assert len(calls) == 2

    # A new scrape starts a new tick: the next reader derives, and the others share it again.
    now[0] = T0 + 3
    _scrape(store, T0 + 3, 0.10)
    daemon.rules.evaluate_once("g")
    daemon.signals_once()
    assert len(calls) == 4
    assert daemon.state.signals["chat"] is daemon.signals.get("chat", 300.0, now[0])
    # what was derived is the new data, not the tick before's: the alert resolved on the new scrape
    assert daemon.state.signals["chat"].engines[0].kv_cache_usage == 0.10
    assert daemon.alerting.active() == []  # both rules read the latest KV use: resolved

    # No scrape for a whole interval (a target that stopped answering): the window slides anyway.
    now[0] = T0 + 9
    daemon.signals_once()
    assert len(calls) == 5


GROUP = """\
groups:
  - name: g
    interval: 15s
    rules:
      - {alert: A, signal: e2e_p99, op: ">", threshold: 100, window: 5m, for: 0s}
      - {alert: B, signal: goodput_ratio, op: "<", threshold: 0, window: 10m, for: 0s}
      - {alert: C, signal: requests_per_s, op: "<", threshold: 0, window: 1m, for: 0s}
      - {alert: D, signal: restarts, op: ">", threshold: 100, window: 10m, for: 0s}
"""


def test_a_groups_windows_come_from_one_read_per_target_and_equal_a_read_of_each(tmp_path, store):
    """The longest window of an alert group is read once and cut down for the shorter ones: each cut equals the
    store's own read of that window, signal for signal, on recorded vLLM and llama-server history with a restart."""
    from tests.helpers import store_recorded_history
    from tuner.signals.derive import SIGNAL_METRICS, metrics_for

    rules = tmp_path / "rules.yaml"
    rules.write_text(GROUP)
    cfg = parse_config(
        "targets:\n  - {name: v, backend: vllm, url: 'http://127.0.0.1:1'}\n"
        "  - {name: l, backend: llamacpp, url: 'http://127.0.0.1:2'}\n"
        "defaults: {scrape_interval: 5s, signal_window: 5m}\n"
        f"alerting: {{rule_files: ['{rules}']}}\n"
    )
    from tuner.rules.evaluate import reads_by_window

    end = store_recorded_history(store, T0)  # 36 vLLM scrapes over 3 minutes, restarted at the 25th
    for now in (end - 5, end - 61.5, end + 400):  # windows holding all, part of and none of the history
        daemon = Daemon(cfg, store, clock=lambda: now)  # noqa: B023 (used within its iteration)
        daemon.rules.evaluate_once("g")
        # two per target, for four rules over three windows: the 10 m window for the series of goodput and restarts,
        # the 5 m one for every series (the 1 m window is cut from it)
        assert daemon.signals.reads == 4
        # what the rules read: the exporter's 5 m window whole, the others for their rules' fields
        fields = reads_by_window(daemon.alerting.rules.groups[0].rules)
        assert fields == {60.0: {"requests_per_s"}, 300.0: {"e2e_p99"}, 600.0: {"goodput_ratio", "restarts"}}
        for name in ("v", "l"):
            for w in (60.0, 300.0, 600.0):
                got = daemon.signals.get(name, w, now, fields=fields)
                only = None if w == 300.0 else fields[w]
                want = compute_signals(
                    store.window(name, now - w, now, metrics=SIGNAL_METRICS), slo=cfg.target(name).slo, only=only
                )
                assert got is not None and _but_samples(got) == _but_samples(want), (name, w, now)
                if w == 600.0:  # read for its fields' series: the same figures, and samples counts those
                    assert (
                        got.as_json()
                        == compute_signals(
                            store.window(name, now - w, now, metrics=metrics_for(only)),
                            slo=cfg.target(name).slo,
                            only=only,
                        ).as_json()
                    )
                    assert all(g.samples < w_.samples for g, w_ in zip(got.engines, want.engines)), name
                else:
                    assert got.as_json() == want.as_json(), (name, w, now)
        assert daemon.signals.reads == 4  # all of them held for the tick
        whole = daemon.signals.get("v", 600.0, now)  # a reader that wants every field: a whole derivation
        assert (
            whole.as_json()
            == compute_signals(
                store.window("v", now - 600, now, metrics=SIGNAL_METRICS), slo=cfg.target("v").slo
            ).as_json()
        )


def test_a_window_past_the_raw_retention_is_not_cut_down(tmp_path, store):
    """A window longer than the raw retention reads at the rollup step: a shorter window is read on its own."""
    from tests.helpers import store_recorded_history
    from tuner.app.signalbook import SignalBook
    from tuner.config import Retention
    from tuner.signals.derive import SIGNAL_METRICS
    from tuner.store.store import Store

    cfg = parse_config("targets:\n  - {name: v, backend: vllm, url: 'http://127.0.0.1:1'}\n")
    end = store_recorded_history(store, T0)
    short = Store(store.engine, retention=Retention(raw="2m"))
    book = SignalBook(cfg, short)
    got = book.get("v", 60.0, end, windows=(60.0, 600.0))
    assert book.reads == 1  # the 1-minute window alone: the 10-minute one is not read for it
    assert got.as_json() == compute_signals(short.window("v", end - 60, end, metrics=SIGNAL_METRICS)).as_json()
    assert (
        book.get("v", 600.0, end).as_json()
        == compute_signals(short.window("v", end - 600, end, metrics=SIGNAL_METRICS)).as_json()
    )
    assert book.reads == 2


def test_a_window_of_its_own_is_derived_for_the_fields_its_rules_read_and_never_served_short(tmp_path):
    """An alert group's own window (not the exporter's) is derived for the fields its rules read only; a reader
    that wants more (status, another group) gets a whole derivation, never the short one; a reader that wants
    no more than was derived shares it. The exporter's window is always derived whole."""
    from tests.helpers import migrated_store, store_recorded_history
    from tuner.app.signalbook import SignalBook

    store = migrated_store(tmp_path)
    t0 = store_recorded_history(store, T0)
    cfg = parse_config(
        "targets:\n  - {name: v, backend: vllm, url: 'http://127.0.0.1:1'}\n"
        "defaults: {scrape_interval: 5s, signal_window: 5m}\n"
    )
    book = SignalBook(cfg, store)
    whole = compute_signals(store.window("v", t0 - 120, t0))
    assert whole.engines[0].ttft_p99 is not None and whole.engines[0].requests_per_s is not None

    short = book.get("v", 120.0, t0, fields={120.0: {"restarts"}})
    assert short.engines[0].ttft_p99 is None and short.engines[0].requests_per_s is None
    assert short.engines[0].restarts == whole.engines[0].restarts
    assert book.get("v", 120.0, t0, fields={120.0: {"restarts"}}) is short  # shared within the tick
    assert book.derived == 1
    rates = book.get("v", 120.0, t0, fields={120.0: {"requests_per_s"}})  # another group's rules: more fields
    assert book.derived == 2
    assert rates.engines[0].requests_per_s == whole.engines[0].requests_per_s
    assert rates.engines[0].ttft_p99 is None
    both = book.get("v", 120.0, t0, fields={120.0: {"restarts", "requests_per_s"}})
    assert both is rates and book.derived == 2  # what was derived for both serves both for the rest of the tick
    full = book.get("v", 120.0, t0)  # wants everything: derived again, whole
    assert book.derived == 3

    assert full == compute_signals(store.window("v", t0 - 120, t0, metrics=full_metrics()))
    assert book.get("v", 120.0, t0, fields={120.0: {"ttft_p99"}}) is full  # the whole one serves a short ask

    exporter = book.get("v", 300.0, t0, fields={300.0: {"restarts"}})  # the daemon's signal window: whole
    assert exporter.engines[0].ttft_p99 is not None


def full_metrics():
    from tuner.signals.derive import SIGNAL_METRICS

    return SIGNAL_METRICS


TWO_GROUPS = """\
groups:
  - name: serving
    interval: 15s
    rules:
      - {alert: A, signal: e2e_p99, op: ">", threshold: 100, window: 5m, for: 0s}
      - {alert: B, signal: goodput_ratio, op: "<", threshold: 0, window: 10m, for: 0s}
  - name: targets
    interval: 15s
    rules:
      - {alert: C, signal: requests_per_s, op: "<", threshold: 0, window: 1m, for: 0s}
      - {alert: D, signal: restarts, op: ">", threshold: 100, window: 10m, for: 0s}
  - name: slow
    interval: 1m
    rules:
      - {alert: E, signal: ttft_p99, op: ">", threshold: 100, window: 30m, for: 0s}
"""


def test_groups_of_one_interval_share_one_read_and_one_derivation_of_each_window(tmp_path, store):
    """Groups that run in the same ticks: the first derives every window and field the others read, from one read
    of each target, so the second derives nothing (it used to re-derive the 10 m window for the field it adds).
    A group of another interval adds nothing to theirs. Every figure the rules read equals a derivation of its
    own from the store, on recorded vLLM history with a restart."""
    from tests.helpers import store_recorded_history
    from tuner.rules.evaluate import reads_by_window
    from tuner.signals.derive import ALWAYS_DERIVED, SIGNAL_METRICS

    rules = tmp_path / "rules.yaml"
    rules.write_text(TWO_GROUPS)
    cfg = parse_config(
        "targets:\n  - {name: v, backend: vllm, url: 'http://127.0.0.1:1'}\n"
        "defaults: {scrape_interval: 5s, signal_window: 5m}\n"
        f"alerting: {{rule_files: ['{rules}']}}\n"
    )
    end = store_recorded_history(store, T0)
    daemon = Daemon(cfg, store, clock=lambda: end)
    asked: list[tuple[float, frozenset | None]] = []

    def derive(window, *, slo=None, only=None):
        asked.append((round((window.end_ms - window.start_ms) / 1000), None if only is None else frozenset(only)))
        return compute_signals(window, slo=slo, only=only)

    daemon.signals._derive = derive
    daemon.rules.evaluate_once("serving")
    first = sorted(asked, key=lambda a: a[0])
    daemon.rules.evaluate_once("targets")
    # 1 m, 5 m, 10 m: once each, none again, from two reads (the 10 m window's series; every series over 5 m)
    assert daemon.signals.reads == 2 and len(asked) == 3, asked
    assert [w for w, _ in first] == [60, 300, 600]  # not the slow group's 30 m
    fields = reads_by_window([r for g in daemon.alerting.rules.groups[:2] for r in g.rules])
    assert fields[600.0] == {"goodput_ratio", "restarts"}  # the 10 m window: a field from each group
    assert first[2][1] == fields[600.0] - ALWAYS_DERIVED  # what the first derivation was asked for (restarts: always)
    for w in (60.0, 300.0, 600.0):
        got = daemon.signals.get("v", w, end, fields=fields)
        want = compute_signals(
            store.window("v", end - w, end, metrics=SIGNAL_METRICS),
            slo=cfg.target("v").slo,
            only=None if w == 300.0 else fields[w],
        )
        assert _but_samples(got) == _but_samples(want), w  # the 10 m window's samples: its series' points
    assert len(asked) == 3


def _but_samples(sig) -> dict:
    """Signals as JSON without each engine's sample count (a window read for some fields' series counts those)."""
    out = sig.as_json()
    for e in out["engines"]:
        del e["samples"]
    return out
