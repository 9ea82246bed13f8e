"""The daemon's alerting loop over a real store: state survives a restart; a bad reload keeps the good rules."""

from __future__ import annotations

import pytest

from tuner.app.alerting import Alerting
from tuner.collect.snapshots import EngineSnapshot, TargetSnapshot
from tuner.config import parse_config
from tuner.daemon import Daemon
from tuner.errors import RuleFileError
from tuner.store.alerts import history

RULES = """\
groups:
  - name: g
    interval: 15s
    rules:
      - {alert: KVHigh, signal: kv_cache_usage, op: ">", threshold: 0.9, window: 10m, for: 5m}
"""


def _cfg(tmp_path, rules_text=RULES):
    path = tmp_path / "rules.yaml"
    path.write_text(rules_text)
    return parse_config(
        f"targets:\n  - {{name: chat, backend: vllm, url: 'http://127.0.0.1:1'}}\n"
        f"alerting: {{rule_files: ['{path}']}}\n"
    ), path


def _scrape(store, ts, kv):
    e = EngineSnapshot(
        backend="vllm", engine="0", model_name="m", values={("vllm:kv_cache_usage_perc", ()): kv}, histograms={}
    )
    store.ingest(TargetSnapshot(target="chat", backend="vllm", ts=ts, duration_s=0.0, engines=(e,)))


def test_pending_timer_survives_a_restart(tmp_path, store):
    cfg, _ = _cfg(tmp_path)
    t0 = 1_800_000_000.0
    first = Alerting(cfg, store, clock=lambda: t0)
    _scrape(store, t0, 0.97)
    first.evaluate_group(first.rules.groups[0])
    assert [a.state for a in first.active()] == ["pending"]
    # tuner stops; 5 minutes later a new process starts: the alert fires on time, not 5 minutes later.
    _scrape(store, t0 + 300, 0.97)
    second = Alerting(cfg, store, clock=lambda: t0 + 300)
    assert [a.state for a in second.active()] == ["pending"]
    second.evaluate_group(second.rules.groups[0])
    (a,) = second.active()
    assert a.state == "firing" and a.active_at_ms == int(t0 * 1000)
    changes = [(e.from_state, e.to_state) for e in reversed(history(store))]
    assert changes == [("inactive", "pending"), ("pending", "firing")]


def test_invalid_rules_stop_the_daemon_and_a_bad_reload_keeps_the_last_good_set(tmp_path, store):
    cfg, path = _cfg(tmp_path, RULES.replace("kv_cache_usage", "kv"))
    with pytest.raises(RuleFileError):
        Daemon(cfg, store)
    path.write_text(RULES)
    daemon = Daemon(cfg, store)
    path.write_text(RULES.replace("threshold: 0.9", "threshold: lots"))
    assert daemon.rules.reload() is False
    assert [r.alert for r in daemon.alerting.rules.rules] == ["KVHigh"]
    assert "keeping the last good rules" in daemon.state.job_errors["rules"]
    path.write_text(RULES.replace("KVHigh", "KVVeryHigh"))
    assert daemon.rules.reload() is True
    assert [r.alert for r in daemon.alerting.rules.rules] == ["KVVeryHigh"]


def test_a_rule_over_groups_judges_what_the_replicas_served_together(tmp_path, store):
    """Two replicas, one much busier and slower than the other. A rule over groups on E2E P99 fires when the
    group's P99 (from the replicas' summed buckets) is above its threshold and not when only one replica's is:
    the thresholds come from the values measured in this run, on each side of the group's P99."""
    from tests.helpers import VLLM_DIR
    from tuner.app.status import group_signals_at
    from tuner.collect import vllm
    from tuner.lab.replay import ReplayExposition
    from tuner.signals.derive import compute_signals

    t0 = 1_800_000_000.0
    busy = ReplayExposition((VLLM_DIR / "metrics_kv_pressure.txt").read_text(), growth=0.05)
    calm = ReplayExposition((VLLM_DIR / "metrics_after_load.txt").read_text(), growth=0.3)
    for i in range(61):
        store.ingest(vllm.snapshot_from_text(busy.render().decode(), target="chat.r1", ts=t0 + 5 * i))
        store.ingest(vllm.snapshot_from_text(calm.render().decode(), target="chat.r2", ts=t0 + 5 * i + 1))
    now = t0 + 300
    group_cfg = (
        "targets:\n  - name: chat\n    backend: vllm\n    url: 'http://127.0.0.1:9'\n"
        "    balancer: {socket: /nonexistent.sock, backend: chat}\n"
        "    replicas: [{name: r1, url: 'http://127.0.0.1:8001'}, {name: r2, url: 'http://127.0.0.1:8002'}]\n"
    )
    cfg = parse_config(group_cfg)
    group = group_signals_at(store, cfg, "chat", window_s=300, at=now).engines[0].e2e_p99
    replicas = [compute_signals(store.window(f"chat.{r}", now - 300, now)).engines[0].e2e_p99 for r in ("r1", "r2")]
    below, above = (group + min(replicas)) / 2, (group + max(replicas)) / 2
    assert min(replicas) < below < group < above < max(replicas)
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"""\
groups:
  - name: g
    rules:
      - {{alert: GroupSlowLow, signal: e2e_p99, op: ">", threshold: {below!r}, over: groups}}
      - {{alert: GroupSlowHigh, signal: e2e_p99, op: ">", threshold: {above!r}, over: groups}}
      - {{alert: ReplicaSlowHigh, signal: e2e_p99, op: ">", threshold: {above!r}}}
      - {{alert: GroupWaiting, signal: requests_waiting, op: ">", threshold: 8, over: groups}}
""")
    cfg = parse_config(group_cfg + f"alerting: {{rule_files: ['{rules}']}}\n")
    alerting = Alerting(cfg, store, clock=lambda: now)
    alerting.evaluate_group(alerting.rules.groups[0])
    fired = {
        (a.labels["alertname"], a.labels.get("group") or a.labels.get("target")): a.value for a in alerting.active()
    }
    slowest = "chat.r1" if replicas[0] > replicas[1] else "chat.r2"
    assert fired.keys() == {("GroupSlowLow", "chat"), ("ReplicaSlowHigh", slowest), ("GroupWaiting", "chat")}
    assert fired[("GroupSlowLow", "chat")] == group
    assert fired[("GroupWaiting", "chat")] == 9  # 9 waiting on the busy replica, 0 on the calm one


def test_the_store_holds_the_evaluated_alerts_after_each_evaluation_writing_only_what_changed(tmp_path, store):
    """Each evaluation writes only the alerts that changed and deletes the gone ones: after every one, a new
    process would load exactly the alerts in memory (pending, firing, resolved and kept, dropped; a rule removed
    by a reload). An evaluation that changes nothing writes nothing; a write that fails (a trigger) is written in
    full by the next one."""
    from sqlalchemy import text

    from tuner.errors import StoreError
    from tuner.rules.state import to_row
    from tuner.store.alerts import load_states

    rules = (
        RULES.replace("for: 5m}", "for: 30s}")
        + '      - {alert: KVLow, signal: kv_cache_usage, op: "<", threshold: 0.5, window: 10m}\n'
    )
    cfg, path = _cfg(tmp_path, rules)
    t0 = 1_800_000_000.0
    clock = [t0]
    alerting = Alerting(cfg, store, clock=lambda: clock[0])
    with store.engine.begin() as conn:  # every row written to alert_states counted
        conn.execute(text("CREATE TABLE writes (n INTEGER)"))
        conn.execute(text("INSERT INTO writes VALUES (0)"))
        for op in ("INSERT", "UPDATE", "DELETE"):
            conn.execute(
                text(f"CREATE TRIGGER count_{op} AFTER {op} ON alert_states BEGIN UPDATE writes SET n = n + 1; END")
            )

    def written() -> int:
        with store.engine.connect() as conn:
            return conn.execute(text("SELECT n FROM writes")).scalar_one()

    def evaluate(kv: float) -> int:
        """Scrape, evaluate; how many alert rows the evaluation wrote."""
        _scrape(store, clock[0], kv)
        before = written()
        alerting.evaluate_group(alerting.rules.groups[0])
        return written() - before

    def same() -> None:
        memory = {(a.rule, a.fingerprint): to_row(a) for alerts in alerting.state.values() for a in alerts.values()}
        assert load_states(store) == memory

    kvs = [0.95, 0.95, 0.97, 0.97, 0.2, 0.2, 0.96, 0.3]
    rows = []
    for i, kv in enumerate(kvs):
        clock[0] = t0 + 15 * i
        rows.append(evaluate(kv))
        same()
    # rows written: KVHigh new (pending); unchanged; fired with a new value; unchanged; KVHigh resolved and KVLow
    # new (firing at once); unchanged (not due for a resend); KVLow resolved and KVHigh pending again; KVHigh's
    # pending alert gone (deleted) and KVLow firing again
    assert rows == [1, 0, 1, 0, 2, 0, 2, 2]
    states = {a.labels["alertname"]: a.state for a in alerting.active()}
    assert states == {"KVLow": "firing"}, states  # KVHigh went pending, firing, resolved, pending, gone
    clock[0] += 0.001  # nothing changed since: nothing is written (the firing KVLow is not due for a resend)
    assert evaluate(0.3) == 0
    same()

    with store.engine.begin() as conn:  # the next write of alert states fails; it is written by the one after
        conn.execute(text("CREATE TRIGGER fail BEFORE UPDATE ON alert_states BEGIN SELECT RAISE(ABORT, 'full'); END"))
    clock[0] += 15
    _scrape(store, clock[0], 0.4)
    with pytest.raises(StoreError, match="full"):
        alerting.evaluate_group(alerting.rules.groups[0])
    with store.engine.begin() as conn:
        conn.execute(text("DROP TRIGGER fail"))
    clock[0] += 15
    evaluate(0.99)
    same()

    path.write_text(RULES)  # KVLow removed by a reload: its alerts leave the store with the next evaluation
    assert alerting.reload()
    clock[0] += 15
    evaluate(0.99)
    same()
    assert {k.split("/")[1] for k, _ in load_states(store)} == {"KVHigh"}
