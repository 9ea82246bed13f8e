"""tuner's rules as a Prometheus rule file, and tuner's scenarios as promtool unit tests.

A rule becomes one Prometheus rule per distinct threshold/for: the default over every target
without an override (``target!~"a|b"``), one per overridden target, and for ``threshold: slo`` one
per target with an SLO. Expressions come from tuner/rules/signals.py: vLLM's own metric names where
a signal has an equivalent, tuner's exported ``tuner_*`` series where it has not. Series are grouped
by ``target``: give the scrape job a ``target`` label (relabel) matching tuner's target names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import yaml

from tuner.config import Target, replica_groups
from tuner.rules.model import Rule, RuleSet
from tuner.rules.signals import ENGINE_BY, SIGNALS

__all__ = ["prometheus_rules", "prometheus_rule_object", "promql", "fmt_duration", "dump"]


def fmt_duration(d: timedelta) -> str:
    ms = int(round(d.total_seconds() * 1000))
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _quote(v: str) -> str:
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _regex_alt(names: Iterable[str]) -> str:
    specials = set(".^$*+?()[]{}|\\")
    return "|".join("".join("\\\\" + c if c in specials else c for c in n) for n in sorted(names))


def promql(rule: Rule, matchers: list[str], threshold: float) -> str:
    spec = SIGNALS[rule.signal]
    template = spec.promql.get(rule.backend) or spec.promql.get("any") or next(iter(spec.promql.values()))
    m = list(matchers)
    relabel = False
    if rule.over == "groups" and "tuner_" in template:
        # tuner exports each group's signals as target="GROUP", engine="all": select those, and name the group
        m = [x.replace("group", "target", 1) for x in m] + ['engine="all"']
        template = template.replace(f"by ({ENGINE_BY})", "by (target, model_name)")
        relabel = True
    elif rule.over == "groups":
        # over vLLM's own series, summed by the `group` label the replicas' scrape config gives them
        m.append('group!=""')
        template = template.replace(ENGINE_BY, "group, model_name")
    if "tuner_" in template and rule.backend in ("vllm", "llamacpp") and rule.scope == "engine":
        m.append(f"backend={_quote(rule.backend)}")  # tuner's engine series carry the target's backend
    sel = "{" + ",".join(m) + "}" if m else ""
    expr = template.format(sel=sel, w=fmt_duration(rule.window))
    if relabel:
        expr = f'label_replace({expr}, "group", "$1", "target", "(.+)")'

    value = repr(threshold) if not float(threshold).is_integer() else str(int(threshold))
    return f"({expr}) {rule.op} {value}" if " / " in expr else f"{expr} {rule.op} {value}"


def _one(rule: Rule, expr: str, hold: timedelta) -> dict[str, Any]:
    out: dict[str, Any] = {"alert": rule.alert, "expr": expr}
    if hold:
        out["for"] = fmt_duration(hold)
    if rule.keep_firing_for:
        out["keep_firing_for"] = fmt_duration(rule.keep_firing_for)
    if rule.labels:
        out["labels"] = dict(rule.labels)
    if rule.annotations:
        out["annotations"] = dict(rule.annotations)
    return out


def _variants(rule: Rule, targets: list[Target]) -> list[dict[str, Any]]:
    label = "group" if rule.over == "groups" else "target"
    if rule.over == "groups":  # a group's threshold: its override, or the SLO its replicas share
        by_name = {g: members[0].model_copy(update={"name": g}) for g, members in replica_groups(targets).items()}
    else:
        by_name = {t.name: t for t in targets}
    special = sorted(set(rule.overrides) | ({n for n, t in by_name.items() if t.slo} if rule.from_slo else set()))
    out = []
    if not rule.from_slo:
        matchers = [f'{label}!~"{_regex_alt(special)}"'] if special else []
        out.append(_one(rule, promql(rule, matchers, rule.threshold), rule.for_))
    for name in special:
        target = by_name.get(name) or Target(name=name, backend="vllm", url="http://127.0.0.1:1")
        threshold = rule.threshold_for(target)
        if threshold is None or math.isnan(threshold):
            continue
        out.append(_one(rule, promql(rule, [f"{label}={_quote(name)}"], threshold), rule.hold_for(target.name)))
    return out


def prometheus_rules(rules: RuleSet, targets: Iterable[Target] = ()) -> dict[str, Any]:
    """The rule file as a dict (dump with ``dump``)."""
    targets = list(targets)
    return {
        "groups": [
            {
                "name": g.name,
                "interval": fmt_duration(g.interval),
                "rules": [v for r in g.rules for v in _variants(r, targets)],
            }
            for g in rules.groups
        ]
    }


def dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, width=200, allow_unicode=True)


def prometheus_rule_object(
    doc: dict[str, Any], *, name: str, namespace: str | None = None, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """The rule file ``doc`` as a prometheus-operator PrometheusRule object (monitoring.coreos.com/v1): its groups
    are the spec; ``labels`` are what the Prometheus resource's ruleSelector matches (e.g. release: prometheus)."""
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = {"app.kubernetes.io/name": "tuner", "app.kubernetes.io/component": "alert-rules", **(labels or {})}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": meta,
        "spec": {"groups": doc["groups"]},
    }
