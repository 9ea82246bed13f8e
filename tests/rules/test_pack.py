"""The default pack: every rule names its runbook (a section of docs/alerts.md) and the dashboard panel that shows
its signal: a panel of the generated dashboards whose queries read a series the rule's exported twin reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuner.daemon.metrics import SIGNAL_GAUGES
from tuner.dashboards import build_dashboards, metric_names, queries
from tuner.rules.export import promql
from tuner.rules.model import Rule, default_rule_files, load_rule_files
from tuner.signals import derive

ROOT = Path(__file__).resolve().parents[2]
PACK = load_rule_files(default_rule_files()).rules
_DASHBOARD = re.compile(r"^(?P<title>.*?) \((?P<uid>tuner-[\w-]+)\) / (?P<panel>.+)$")


def _anchors() -> set[str]:
    heads = re.findall(r"(?m)^#{1,6} (.*)$", (ROOT / "docs" / "alerts.md").read_text())
    return {re.sub(r" ", "-", re.sub(r"[^\w\- ]", "", h.strip().lower())) for h in heads}


def _aliases() -> dict[str, set[str]]:
    """tuner's copy of a server's gauge -> the server's own series (a panel may show either)."""
    out: dict[str, set[str]] = {}
    for field, (name, _) in SIGNAL_GAUGES.items():
        out[name] = {g[field] for g in derive._GAUGES.values() if field in g}  # noqa: SLF001 (the name table)
    return out


def _reads(rule: Rule) -> set[str]:
    names = metric_names(promql(rule, [], rule.threshold))
    return names | {a for n in names for a in _aliases().get(n, ())}


@pytest.mark.parametrize("rule", PACK, ids=lambda r: f"{r.alert}-{r.backend}")
def test_every_rule_names_its_runbook_and_a_panel_that_shows_its_signal(rule):
    assert rule.annotations["runbook_url"] == f"docs/alerts.md#{rule.alert.lower()}"
    assert rule.alert.lower() in _anchors(), f"docs/alerts.md has no runbook section {rule.alert}"
    m = _DASHBOARD.match(rule.annotations["dashboard"])
    assert m, rule.annotations["dashboard"]
    dashboard = build_dashboards()[m["uid"]]
    assert dashboard["title"] == m["title"]
    panel = [q for q in queries(dashboard) if q.kind == "panel" and q.where.rsplit(" [", 1)[0] == m["panel"]]
    assert panel, f"{m['uid']} has no panel {m['panel']!r}"
    shown = set().union(*(metric_names(q.expr) for q in panel))
    assert shown & _reads(rule), f"{m['panel']} reads {sorted(shown)}, the rule {sorted(_reads(rule))}"


def test_the_check_can_fail():
    """A panel that shows another signal does not count."""
    kv = next(r for r in PACK if r.alert == "KVCacheHigh" and r.backend == "vllm")
    preempt = next(q for q in queries(build_dashboards()["tuner-vllm"]) if q.where.startswith("Preemptions ["))
    assert not metric_names(preempt.expr) & _reads(kv)
