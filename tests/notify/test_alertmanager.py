"""tuner → a real Alertmanager 0.25 → its webhook: firing, resolved, Alertmanager down and back, restarts."""

from __future__ import annotations

import time
from collections import Counter

from tuner.app.alerting import Alerting
from tuner.collect.snapshots import EngineSnapshot, TargetSnapshot
from tuner.config import parse_config
from tuner.store.alerts import outbox_size

RULES = """\
groups:
  - name: am-test
    interval: 1s
    rules:
      - alert: KVCacheHigh
        signal: kv_cache_usage
        op: ">"
        threshold: 0.9
        window: 1m
        labels: {severity: critical, team: serving}
        annotations: {summary: "KV cache {{ $value | humanizePercentage }} on {{ $labels.target }}"}
"""


def _setup(tmp_path, store, am_urls):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    ams = ", ".join(f"'{u}'" for u in am_urls)
    cfg = parse_config(
        f"targets:\n  - {{name: chat, backend: vllm, url: 'http://127.0.0.1:1'}}\n"
        f"alerting: {{rule_files: ['{rules}'], alertmanagers: [{ams}], resend_delay: 1m}}\n"
    )
    return cfg


def _scrape(store, kv: float, ts: float | None = None) -> None:
    engine = EngineSnapshot(
        backend="vllm", engine="0", model_name="m", values={("vllm:kv_cache_usage_perc", ()): kv}, histograms={}
    )
    store.ingest(
        TargetSnapshot(target="chat", backend="vllm", ts=ts or time.time(), duration_s=0.01, engines=(engine,))
    )


def _cycle(alerting: Alerting) -> None:
    alerting.evaluate_group(alerting.rules.groups[0])
    alerting.flush()


def test_firing_then_resolved_reach_the_webhook_with_labels_and_annotations(
    tmp_path, store, alertmanager_factory, webhook
):
    am = alertmanager_factory().start()
    alerting = Alerting(_setup(tmp_path, store, [am.url]), store, clock=time.time)
    _scrape(store, 0.97)
    _cycle(alerting)
    assert webhook.wait_for(lambda w: w.alerts("firing")), webhook.bodies
    firing = webhook.alerts("firing")[0]
    assert firing["labels"] == {
        "alertname": "KVCacheHigh",
        "target": "chat",
        "engine": "0",
        "model_name": "m",
        "severity": "critical",
        "team": "serving",
    }
    assert firing["annotations"] == {"summary": "KV cache 97% on chat"}
    assert firing["generatorURL"].startswith("http://127.0.0.1:9464/metrics#alert=am-test/KVCacheHigh")

    time.sleep(1.1)  # real time: Alertmanager reads startsAt/endsAt against its own clock, not an injected one
    _scrape(store, 0.2)
    _cycle(alerting)
    assert webhook.wait_for(lambda w: w.alerts("resolved")), webhook.bodies
    resolved = webhook.alerts("resolved")[0]
    assert resolved["labels"] == firing["labels"] and resolved["endsAt"] > resolved["startsAt"]
    assert outbox_size(store) == 0


def test_alertmanager_down_then_up_every_alert_delivered_once(tmp_path, store, alertmanager_factory, webhook):
    am = alertmanager_factory()  # port chosen, nothing listening yet
    cfg = _setup(tmp_path, store, [am.url])
    alerting = Alerting(cfg, store, clock=time.time)
    # Two engines over the threshold: two alerts, queued while Alertmanager is down.
    for engine in ("0", "1"):
        e = EngineSnapshot(
            backend="vllm",
            engine=engine,
            model_name="m",
            values={("vllm:kv_cache_usage_perc", ()): 0.99},
            histograms={},
        )
        store.ingest(TargetSnapshot(target="chat", backend="vllm", ts=time.time(), duration_s=0.01, engines=(e,)))
    alerting.evaluate_group(alerting.rules.groups[0])
    first = alerting.flush()
    assert first.failed == 1 and first.sent == 0 and "connection refused" in first.errors[am.url]
    assert outbox_size(store) == 1

    # tuner restarts while Alertmanager is still down: the outbox is in the store, not in memory.
    restarted = Alerting(cfg, store, clock=lambda: time.time() + 5)  # past the first backoff (2 s)
    am.start()
    result = restarted.flush()
    assert result.sent == 1 and outbox_size(store) == 0
    assert webhook.wait_for(lambda w: len(w.alerts("firing")) >= 2), webhook.bodies
    time.sleep(2.5)  # real time: several of Alertmanager's group intervals, when it would re-notify a duplicate
    per_alert = Counter(a["fingerprint"] for a in webhook.alerts("firing"))
    assert sorted(per_alert.values()) == [1, 1]


def test_resolved_never_overtakes_firing_while_an_alertmanager_is_down(tmp_path, store, alertmanager_factory, webhook):
    am = alertmanager_factory()
    alerting = Alerting(_setup(tmp_path, store, [am.url]), store, clock=time.time)
    _scrape(store, 0.97)
    _cycle(alerting)  # firing queued, send fails
    time.sleep(1.1)  # real time: Alertmanager reads startsAt/endsAt against its own clock, not an injected one
    _scrape(store, 0.1)
    alerting.evaluate_group(alerting.rules.groups[0])  # resolved queued behind it
    assert outbox_size(store) == 2
    am.start()
    later = Alerting(alerting.cfg, store, clock=lambda: time.time() + 5)
    assert later.flush().sent == 2
    assert webhook.wait_for(lambda w: w.alerts("resolved"))
    # Alertmanager got firing then resolved, so its last word on the alert is "resolved".
    assert webhook.bodies[-1]["status"] == "resolved"


def test_each_alertmanager_gets_every_alert_even_when_one_is_down(tmp_path, store, alertmanager_factory, webhook):
    up, down = alertmanager_factory().start(), alertmanager_factory()
    alerting = Alerting(_setup(tmp_path, store, [up.url, down.url]), store, clock=time.time)
    _scrape(store, 0.97)
    alerting.evaluate_group(alerting.rules.groups[0])
    first = alerting.flush()
    assert (first.sent, first.failed) == (1, 1) and down.url in first.errors and up.url not in first.errors
    assert webhook.wait_for(lambda w: len(w.bodies) == 1)
    down.start()
    later = Alerting(alerting.cfg, store, clock=lambda: time.time() + 5)
    assert later.flush().sent == 1 and outbox_size(store) == 0
    # Both Alertmanagers route to the same webhook: one notification from each.
    assert webhook.wait_for(lambda w: len(w.bodies) == 2)
    ports = {b["externalURL"].rsplit(":", 1)[1] for b in webhook.bodies}  # each names itself
    assert ports == {up.url.rsplit(":", 1)[1], down.url.rsplit(":", 1)[1]}
