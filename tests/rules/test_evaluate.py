"""The state machine and Prometheus's send rules, step by step, with times worked out by hand."""

from __future__ import annotations

from datetime import timedelta

from tuner.rules.evaluate import evaluate, payload, to_send
from tuner.rules.model import parse_rules

RULES = parse_rules("""
groups:
  - name: g
    rules:
      - {alert: Hot, signal: kv_cache_usage, op: ">", threshold: 0.9, for: 1m, labels: {severity: page},
         annotations: {summary: "at {{ $value }}"}}
      - {alert: Now, signal: kv_cache_usage, op: ">", threshold: 0.9}
""")
HOT, NOW = RULES.rules
S = 1000
X = ({"target": "t", "engine": "0", "model_name": "m"}, 0.95)


def _run(rule, steps):
    """steps: list of (t seconds, result list); returns the state after each step."""
    state, out = {}, []
    for t, result in steps:
        state, _ = evaluate(rule, result, state, t * S)
        out.append({a.state for a in state.values()} or {"none"})
    return state, out


def test_pending_then_firing_after_for():
    _, states = _run(HOT, [(0, [X]), (30, [X]), (59, [X]), (60, [X])])
    assert states == [{"pending"}, {"pending"}, {"pending"}, {"firing"}]


def test_for_zero_fires_at_first_evaluation_and_labels_and_annotations():
    state, states = _run(NOW, [(0, [X])])
    (a,) = state.values()
    assert states == [{"firing"}] and a.fired_at_ms == 0
    assert a.labels == {"target": "t", "engine": "0", "model_name": "m", "alertname": "Now"}
    state, _ = _run(HOT, [(0, [X])])
    (a,) = state.values()
    assert a.labels["severity"] == "page" and a.annotations == {"summary": "at 0.95"}


def test_pending_that_clears_is_dropped_and_starts_over():
    state, states = _run(HOT, [(0, [X]), (30, []), (45, [X]), (100, [X]), (105, [X])])
    assert states == [{"pending"}, {"none"}, {"pending"}, {"pending"}, {"firing"}]  # 45 s + 60 s = 105 s


def test_resolved_alert_is_kept_15_minutes_then_dropped():
    retention = 15 * 60
    state, states = _run(NOW, [(0, [X]), (10, []), (10 + retention, []), (11 + retention, [])])
    assert states[:3] == [{"firing"}, {"inactive"}, {"inactive"}] and states[3] == {"none"}


def test_resends_follow_prometheus():
    state, _ = _run(NOW, [(0, [X])])
    alerts = list(state.values())
    resend, interval = timedelta(minutes=1), timedelta(seconds=15)
    sent = to_send(alerts, 0, resend_delay=resend, interval=interval)
    assert len(sent) == 1 and sent[0].valid_until_ms == 4 * 60 * S  # now + 4 x max(interval, resend)
    assert to_send(alerts, 30 * S, resend_delay=resend, interval=interval) == []
    assert to_send(alerts, 60 * S, resend_delay=resend, interval=interval) == []  # LastSent + 1m is not Before now
    assert len(to_send(alerts, 61 * S, resend_delay=resend, interval=interval)) == 1
    # resolved: sent at once even inside the resend delay, with endsAt = resolved time
    state, _ = evaluate(NOW, [], {a.fingerprint: a for a in alerts}, 70 * S)
    again = to_send(state.values(), 70 * S, resend_delay=resend, interval=interval)
    assert len(again) == 1 and payload(again[0], "u")["endsAt"] == "1970-01-01T00:01:10.000Z"
    assert payload(sent[0], "u")["endsAt"] == "1970-01-01T00:04:00.000Z"  # ValidUntil while firing


def test_pending_is_never_sent():
    state, _ = _run(HOT, [(0, [X])])
    assert to_send(state.values(), 0, resend_delay=timedelta(minutes=1), interval=timedelta(seconds=15)) == []


def test_keep_firing_for():
    rule = parse_rules("""
groups:
  - name: g
    rules:
      - {alert: K, signal: kv_cache_usage, op: ">", threshold: 0.9, keep_firing_for: 30s}
""").rules[0]
    _, states = _run(rule, [(0, [X]), (10, []), (39, []), (40, []), (50, [X])])
    # condition gone at 10 s: kept firing while now - 10 s < 30 s; resolved at 40 s; back as a new alert
    assert states == [{"firing"}, {"firing"}, {"firing"}, {"inactive"}, {"firing"}]


# ---- the query result of signals that do not come from a target's scrapes ------------------------------------


def test_tuner_signals_have_one_value_and_no_target_and_self_signals_take_overrides():
    from tuner.config import parse_config
    from tuner.rules.evaluate import vector

    rules = parse_rules("""
groups:
  - name: g
    rules:
      - {alert: Out, signal: notifications_queued_growth, op: ">", threshold: 0, window: 10m}
      - {alert: Thrash, signal: applies_per_hour, op: ">", threshold: 3, overrides: {b: {threshold: 10}}}
""")
    out, thrash = rules.rules
    targets = parse_config(
        "targets:\n  - {name: a, backend: vllm, url: 'http://127.0.0.1:1'}\n"
        "  - {name: b, backend: vllm, url: 'http://127.0.0.1:2'}\n"
    ).targets
    asked = []

    def own(target, signal, window):
        asked.append((target, signal, window))
        return {"": 4.0, "a": 5.0, "b": 5.0}[target]

    assert vector(out, targets, lambda *_: None, target_signal=own) == [({}, 4.0)]
    assert asked == [("", "notifications_queued_growth", timedelta(minutes=10))]
    assert vector(thrash, targets, lambda *_: None, target_signal=own) == [({"target": "a"}, 5.0)]  # b's is 10
    assert vector(out, targets, lambda *_: None) == []  # no source of tuner's own signals: no value, no alert


def test_serving_stalled_is_a_failed_scrape_whose_health_answered():
    from tuner.config import parse_config
    from tuner.rules.evaluate import vector
    from tuner.signals.derive import TargetSignals
    from tuner.store.window import TargetHealth

    (rule,) = parse_rules(
        "groups: [{name: g, rules: [{alert: S, signal: serving_stalled, op: '==', threshold: 1, backend: llamacpp}]}]"
    ).rules
    targets = parse_config(
        "targets:\n  - {name: l, backend: llamacpp, url: 'http://127.0.0.1:1'}\n"
        "  - {name: v, backend: vllm, url: 'http://127.0.0.1:2'}\n"
    ).targets

    def health(state, healthy):
        return lambda name, w: TargetSignals(
            name, "llamacpp", 300, 0, TargetHealth(state, "", 0, None, 0, 1, healthy), ()
        )

    assert vector(rule, targets, health("down", True)) == [({"target": "l"}, 1.0)]  # not v: backend llamacpp
    assert vector(rule, targets, health("down", None)) == []
    assert vector(rule, targets, health("up", True)) == []
