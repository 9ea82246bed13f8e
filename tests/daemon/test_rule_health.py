"""A rule that fails to evaluate is isolated and visible (issue 39, item 6): the group's other rules go on firing,
tuner_job_error names the rule on tuner's own /metrics, and the log says so once per kind of failure, not at
every tick."""

from __future__ import annotations

import logging
import math
from dataclasses import replace

from prometheus_client import CollectorRegistry, generate_latest

from tuner.collect.snapshots import EngineSnapshot, TargetSnapshot
from tuner.config import parse_config
from tuner.daemon import Daemon
from tuner.daemon.metrics import TunerCollector
from tuner.rules.model import RuleSet

RULES = """\
groups:
  - name: g
    interval: 15s
    rules:
      - {alert: Broken, signal: kv_cache_usage, op: ">", threshold: 0.1, window: 1m}
      - {alert: KVHigh, signal: kv_cache_usage, op: ">", threshold: 0.5, window: 1m}
"""


def _scrape(store, ts: float, kv: float) -> None:
    e = EngineSnapshot(
        backend="vllm", engine="0", model_name="m", values={("vllm:kv_cache_usage_perc", ()): kv}, histograms={}
    )
    store.ingest(TargetSnapshot(target="chat", backend="vllm", ts=ts, duration_s=0.0, engines=(e,)))


def _metrics(daemon: Daemon) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TunerCollector(daemon.state))
    return generate_latest(registry).decode()


def test_a_rule_that_fails_to_evaluate_leaves_its_group_evaluating_and_shows_once(tmp_path, store, caplog):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    cfg = parse_config(
        f"targets:\n  - {{name: chat, backend: vllm, url: 'http://127.0.0.1:1', slo: {{ttft_p99: 1s}}}}\n"
        f"alerting: {{rule_files: ['{rules}']}}\n"
    )
    now = [1_800_000_000.0]
    daemon = Daemon(cfg, store, clock=lambda: now[0])
    # The loader refuses a NaN threshold now; a rule built by hand with one stands for any rule that fails when
    # evaluated (before the loader check, `threshold: .nan` made every evaluation of its group raise KeyError).
    (group,) = daemon.alerting.rules.groups
    broken = replace(group.rules[0], threshold=math.nan)
    group = replace(group, rules=(broken, group.rules[1]))
    daemon.alerting.rules = RuleSet((group,), daemon.alerting.rules.files)

    caplog.set_level(logging.INFO, logger="tuner")
    for _ in range(5):
        _scrape(store, now[0], 0.9)
        daemon.rules.evaluate_once("g")
        now[0] += 15
    firing = [a for a in daemon.alerting.active() if a.state == "firing"]
    assert [a.labels["alertname"] for a in firing] == ["KVHigh"]
    assert 'tuner_job_error{job="rule:g/Broken"} 1.0' in _metrics(daemon)
    assert "rules:g" not in daemon.state.job_errors
    said = [r for r in caplog.records if "g/Broken" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.ERROR, [r.getMessage() for r in said]
    assert "KeyError" in said[0].getMessage() and str(rules) in said[0].getMessage()

    # a reload of the (good) file replaces the rule: the error clears
    assert daemon.rules.reload() is True
    daemon.rules.evaluate_once("g")
    assert 'job="rule:g/Broken"' not in _metrics(daemon)
    assert {a.labels["alertname"] for a in daemon.alerting.active() if a.state != "inactive"} == {"Broken", "KVHigh"}
