"""Prometheus's alerting state machine as pure functions of (rule, query result, previous state, now).

``evaluate`` follows Prometheus 2.42's ``AlertingRule.Eval``: a new result is pending at ``now``
(firing at once when ``for`` is 0); pending becomes firing once ``for`` has passed; a firing alert
whose condition stopped holds for ``keep_firing_for``, then resolves; a pending one just goes; a
resolved alert is kept 15 minutes so it can be re-sent as resolved. ``to_send`` is its
``sendAlerts``/``needsSending`` with ``ValidUntil = now + 4 × max(interval, resend_delay)``, and
``payload`` its conversion to Alertmanager's API (``endsAt`` = resolved time or ValidUntil).
Evaluation never sends: the daemon hands what ``to_send`` returns to tuner/notify.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from tuner.config import Target, replica_groups
from tuner.rules.model import OPS, Rule
from tuner.rules.signals import SELF_SIGNALS
from tuner.rules.state import Alert, AlertState
from tuner.rules.templates import render
from tuner.signals.derive import TargetSignals, queue_ratio
from tuner.store.window import GpuLatest

__all__ = [
    "Sample",
    "fingerprint",
    "vector",
    "reads_by_window",
    "configured_max_num_seqs",
    "evaluate",
    "to_send",
    "payload",
    "RESOLVED_RETENTION",
]

RESOLVED_RETENTION = timedelta(minutes=15)
Sample = tuple[dict[str, str], float]  # (labels, value) of one query result


def fingerprint(labels: Mapping[str, str]) -> str:
    return hashlib.sha1(json.dumps(sorted(labels.items())).encode()).hexdigest()[:16]


def configured_max_num_seqs(target: Target) -> float | None:
    """max-num-seqs from the config alone (managed flags first), in any spelling of the flag."""
    for flags in ((target.managed.flags if target.managed else {}), target.flags):
        for key in ("max_num_seqs", "max-num-seqs", "--max-num-seqs"):
            if flags.get(key) is not None:
                return float(flags[key])
    return None


def reads_by_window(rules: Iterable[Rule]) -> dict[float, set[str]]:
    """The EngineSignals fields ``rules`` read from a target's signals, per window (seconds): what a derivation
    for them needs (compute_signals's ``only``). Rules over groups and over GPUs read no target's signals."""
    out: dict[float, set[str]] = {}
    for rule in rules:
        if rule.scope in ("gpu", "tuner") or rule.over == "groups" or rule.signal in SELF_SIGNALS:
            continue
        need = out.setdefault(rule.window.total_seconds(), set())
        if rule.signal == "queue_to_max_num_seqs":
            need.add("requests_waiting")
        elif rule.scope == "target":
            need.add("restarts")  # up and server_healthy read the health, which every derivation carries
        else:
            need.add(rule.signal)
    return out


def _engine_value(rule: Rule, target: Target, e, limit: float | None) -> float | None:
    if rule.signal == "queue_to_max_num_seqs":
        return queue_ratio(e, limit)
    return getattr(e, rule.signal)


def vector(
    rule: Rule,
    targets: Iterable[Target],
    signals: Callable[[str, timedelta], TargetSignals | None],
    gpus: Iterable[GpuLatest] = (),
    *,
    target_signal: Callable[[str, str, timedelta], float | None] | None = None,
    max_num_seqs: Callable[[Target], float | None] = configured_max_num_seqs,
) -> list[Sample]:
    """The rule's query result: every (labels, value) whose value satisfies the condition.

    ``target_signal(target, signal, window)`` gives the signals that do not come from scrapes (SELF_SIGNALS:
    tuner's own journal, counters and outbox; target "" for a tuner signal), None when there is none.
    ``max_num_seqs(target)`` is the limit the server runs with (the daemon passes the flags in force; by default
    the config's).
    """
    op = OPS[rule.op]
    out: list[Sample] = []
    if rule.scope == "tuner":  # one value for the whole tuner, no target label
        v = target_signal("", rule.signal, rule.window) if target_signal is not None else None
        return [({}, v)] if v is not None and op(v, rule.threshold) else []
    if rule.scope == "gpu":
        for g in gpus:
            if rule.signal == "gpu_memory_used_ratio":
                v = (
                    g.memory_used_bytes / g.memory_total_bytes
                    if g.memory_used_bytes is not None and g.memory_total_bytes
                    else None
                )
            else:
                v = float(len(g.processes))
            if v is not None and op(v, rule.threshold):
                out.append(({"gpu": str(g.index), "uuid": g.uuid}, v))
        return out
    if rule.over == "groups":
        return _group_vector(rule, targets, signals, max_num_seqs)
    for t in targets:
        if rule.backend != "any" and t.backend != rule.backend:
            continue
        if rule.signal in SELF_SIGNALS:
            v = target_signal(t.name, rule.signal, rule.window) if target_signal is not None else None
            limit = rule.threshold_for(t)
            if v is not None and limit is not None and op(v, limit):
                out.append(({"target": t.name}, v))
            continue
        sig = signals(t.name, rule.window)
        if sig is None:
            continue
        threshold = rule.threshold_for(t)
        if threshold is None:
            continue
        if rule.scope == "target":
            v = _target_value(rule, sig)
            if v is not None and op(v, threshold):
                out.append(({"target": t.name}, v))
            continue
        limit = max_num_seqs(t) if rule.signal == "queue_to_max_num_seqs" else None
        for e in sig.engines:
            v = _engine_value(rule, t, e, limit)
            if v is not None and op(v, threshold):
                out.append(({"target": t.name, "engine": e.engine, "model_name": e.model_name}, float(v)))
    return out


def _group_vector(
    rule: Rule,
    targets: Iterable[Target],
    signals: Callable[[str, timedelta], TargetSignals | None],
    max_num_seqs: Callable[[Target], float | None],
) -> list[Sample]:
    """A rule with ``over: groups``: one value per replica group and engine ("all"), from ``signals(GROUP, w)``
    (what its replicas served together); the group's threshold is its override or its SLO (the replicas share
    one), queue_to_max_num_seqs divides by the replicas' max-num-seqs summed."""
    op = OPS[rule.op]
    out: list[Sample] = []
    for name, members in replica_groups(targets).items():
        first = members[0]
        if rule.backend != "any" and first.backend != rule.backend:
            continue
        threshold = rule.threshold_for(first.model_copy(update={"name": name}))
        if threshold is None:
            continue
        sig = signals(name, rule.window)
        if sig is None:
            continue
        limit = None
        if rule.signal == "queue_to_max_num_seqs":
            limits = [max_num_seqs(m) for m in members]
            limit = sum(x for x in limits if x is not None) if all(x is not None for x in limits) else None
        for e in sig.engines:
            v = _engine_value(rule, first, e, limit)
            if v is not None and op(v, threshold):
                out.append(({"group": name, "engine": e.engine, "model_name": e.model_name}, float(v)))
    return out


def _target_value(rule: Rule, sig: TargetSignals) -> float | None:
    h = sig.health
    if rule.signal == "up":
        return None if h is None else (0.0 if h.health == "down" else 1.0)
    if rule.signal == "server_healthy":
        return None if h is None or h.server_healthy is None else float(h.server_healthy)
    if rule.signal == "serving_stalled":  # /health answered 200 and the scrape failed: as PromQL, healthy x (1 - up)
        return (
            None
            if h is None or h.server_healthy is None
            else float(h.server_healthy) * (1.0 if h.health == "down" else 0.0)
        )
    if rule.signal == "restarts":
        return float(max((e.restarts for e in sig.engines), default=0)) if sig.engines else None
    raise KeyError(rule.signal)


def evaluate(
    rule: Rule, result: Iterable[Sample], prev: Mapping[str, Alert], now_ms: int, *, key: str | None = None
) -> tuple[dict[str, Alert], list[dict]]:
    """One evaluation: (the rule's alerts after it, state-change events). ``prev`` is not modified.

    ``key`` names the rule's state (group/alert); the alert name alone by default.
    """
    key = key or rule.alert
    active = {fp: replace(a) for fp, a in prev.items()}
    events: list[dict] = []

    def changed(a: Alert, old: str) -> None:
        if a.state != old:
            events.append(
                {
                    "ts_ms": now_ms,
                    "rule": key,
                    "fingerprint": a.fingerprint,
                    "labels": json.dumps(a.labels, sort_keys=True),
                    "from_state": old,
                    "to_state": a.state,
                    "value": a.value,
                }
            )

    seen: set[str] = set()
    for sample_labels, value in result:
        labels = {**sample_labels, **rule.labels, "alertname": rule.alert}
        fp = fingerprint(labels)
        seen.add(fp)
        annotations = {k: render(v, labels, value) for k, v in rule.annotations.items()}
        a = active.get(fp)
        if a is not None and a.state != AlertState.INACTIVE:
            a.value, a.annotations = value, annotations
            continue
        active[fp] = Alert(
            rule=key,
            fingerprint=fp,
            labels=labels,
            annotations=annotations,
            state=AlertState.PENDING,
            value=value,
            active_at_ms=now_ms,
        )
        changed(active[fp], AlertState.INACTIVE)

    keep_ms = int(rule.keep_firing_for.total_seconds() * 1000)
    for fp in list(active):
        a = active[fp]
        if fp not in seen:
            keep = False
            if a.state == AlertState.FIRING and keep_ms > 0:
                if a.keep_firing_since_ms is None:
                    a.keep_firing_since_ms = now_ms
                keep = now_ms - a.keep_firing_since_ms < keep_ms
            if a.state == AlertState.PENDING or (
                a.resolved_at_ms is not None and now_ms - a.resolved_at_ms > RESOLVED_RETENTION.total_seconds() * 1000
            ):
                del active[fp]
            if a.state != AlertState.INACTIVE and not keep:
                old, a.state, a.resolved_at_ms = a.state, AlertState.INACTIVE, now_ms
                changed(a, old)
            if not keep:
                continue
        else:
            a.keep_firing_since_ms = None
        hold_ms = int(rule.hold_for(a.labels.get("target")).total_seconds() * 1000)
        if a.state == AlertState.PENDING and now_ms - a.active_at_ms >= hold_ms:
            a.state, a.fired_at_ms = AlertState.FIRING, now_ms
            changed(a, AlertState.PENDING)
    return active, events


def to_send(alerts: Iterable[Alert], now_ms: int, *, resend_delay: timedelta, interval: timedelta) -> list[Alert]:
    """Alerts due for (re)sending; marks them sent and sets ValidUntil, as Prometheus does."""
    delta_ms = int(max(resend_delay, interval).total_seconds() * 1000)
    resend_ms = int(resend_delay.total_seconds() * 1000)
    out = []
    for a in alerts:
        if a.state == AlertState.PENDING:
            continue
        resolved_since_sent = a.resolved_at_ms is not None and (
            a.last_sent_at_ms is None or a.resolved_at_ms > a.last_sent_at_ms
        )
        if resolved_since_sent or a.last_sent_at_ms is None or a.last_sent_at_ms + resend_ms < now_ms:
            a.last_sent_at_ms = now_ms
            a.valid_until_ms = now_ms + 4 * delta_ms
            out.append(replace(a))
    return out


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def payload(a: Alert, generator_url: str) -> dict:
    """An Alertmanager API v2 alert (postableAlert)."""
    ends = a.resolved_at_ms if a.resolved_at_ms is not None else a.valid_until_ms
    body = {
        "labels": a.labels,
        "annotations": a.annotations,
        "generatorURL": generator_url,
        "startsAt": _iso(a.fired_at_ms if a.fired_at_ms is not None else a.active_at_ms),
    }
    if ends is not None:
        body["endsAt"] = _iso(ends)
    return body
