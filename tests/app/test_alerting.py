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
    return parse_config(f"targets:\n  - {{name: chat, backend: vllm, url: 'http://127.0.0.1:1'}}\n"
                        f"alerting: {{rule_files: ['{path}']}}\n"), path


def _scrape(store, ts, kv):
    e = EngineSnapshot(backend="vllm", engine="0", model_name="m", values={("vllm:kv_cache_usage_perc", ()): kv},
                       histograms={})
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
    assert daemon.reload_rules() is False
    assert [r.alert for r in daemon.alerting.rules.rules] == ["KVHigh"]
    assert "keeping the last good rules" in daemon.state.job_errors["rules"]
    path.write_text(RULES.replace("KVHigh", "KVVeryHigh"))
    assert daemon.reload_rules() is True
    assert [r.alert for r in daemon.alerting.rules.rules] == ["KVVeryHigh"]
