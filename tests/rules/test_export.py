"""`tuner alerts export` output is a valid Prometheus rule file (real promtool) with the expressions we intend."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import require_tool
from tuner.config import parse_config
from tuner.rules.export import prometheus_rules
from tuner.rules.model import default_rule_files, load_rule_files, parse_rules


def test_exported_default_pack_passes_promtool_check(tmp_path):
    promtool = require_tool("promtool")
    cfg = tmp_path / "tuner.yaml"
    cfg.write_text(
        "targets:\n  - {name: chat, backend: vllm, url: 'http://127.0.0.1:8000', "
        "slo: {ttft_p99: 500ms, e2e_p99: 20s}}\n"
    )
    out = tmp_path / "rules.yml"
    proc = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "--config", str(cfg), "alerts", "export", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    check = subprocess.run([promtool, "check", "rules", str(out)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    # 21 fixed-threshold rules, plus TTFTHigh and SLOBurn (threshold: slo) for chat, the one target with
    # an SLO: as many as the pack has rules.
    pack = load_rule_files(default_rule_files()).rules
    assert sum(not r.from_slo for r in pack) == 21 and sum(r.from_slo for r in pack) == 2
    assert "SUCCESS: 23 rules found" in check.stdout


def test_overrides_split_into_disjoint_rules():
    rules = parse_rules("""
groups:
  - name: g
    rules:
      - {alert: KV, signal: kv_cache_usage, op: ">", threshold: 0.95, for: 5m,
         overrides: {a.b: {threshold: 0.8}, c: {for: 1m}}}
""")
    doc = prometheus_rules(rules, parse_config("targets: []").targets)
    exprs = [(r["expr"], r.get("for")) for r in doc["groups"][0]["rules"]]
    assert exprs == [
        ('max by (target, engine, model_name) (vllm:kv_cache_usage_perc{target!~"a\\\\.b|c"}) > 0.95', "5m"),
        ('max by (target, engine, model_name) (vllm:kv_cache_usage_perc{target="a.b"}) > 0.8', "5m"),
        ('max by (target, engine, model_name) (vllm:kv_cache_usage_perc{target="c"}) > 0.95', "1m"),
    ]


def test_rules_over_groups_export_sums_by_group_and_pass_promtool(tmp_path):
    """`over: groups`: over vLLM's series, summed by the replicas' `group` label; over tuner's series, the group's
    own (target=GROUP, engine="all"), renamed to `group`; overrides and SLOs by group name."""
    import yaml

    promtool = require_tool("promtool")
    cfg = parse_config(
        "targets:\n  - name: chat\n    backend: vllm\n    url: 'http://127.0.0.1:8000'\n"
        "    balancer: {socket: /run/haproxy.sock, backend: chat}\n"
        "    replicas: [{name: r1, url: 'http://127.0.0.1:8001'}, {name: r2, url: 'http://127.0.0.1:8002'}]\n"
        "    slo: {e2e_p99: 20s, objective: 0.9}\n"
        "  - {name: solo, backend: vllm, url: 'http://127.0.0.1:8003'}\n"
    )
    rules = parse_rules("""
groups:
  - name: g
    rules:
      - {alert: GroupE2E, signal: e2e_p99, op: ">", threshold: slo, over: groups}
      - {alert: GroupWaiting, signal: requests_waiting, op: ">", threshold: 10, over: groups,
         overrides: {chat: {threshold: 4}}}
      - {alert: GroupGoodput, signal: goodput_ratio, op: "<", threshold: slo, over: groups}
""")
    doc = prometheus_rules(rules, cfg.targets)
    exprs = {(r["alert"], r["expr"]) for r in doc["groups"][0]["rules"]}
    assert exprs == {
        (
            "GroupE2E",
            "histogram_quantile(0.99, sum by (group, model_name, le) (increase("
            'vllm:e2e_request_latency_seconds_bucket{group="chat",group!=""}[5m]))) > 20',
        ),
        ("GroupWaiting", 'sum by (group, model_name) (vllm:num_requests_waiting{group!~"chat",group!=""}) > 10'),
        ("GroupWaiting", 'sum by (group, model_name) (vllm:num_requests_waiting{group="chat",group!=""}) > 4'),
        (
            "GroupGoodput",
            'label_replace(max by (target, model_name) (tuner_goodput_ratio{target="chat",engine="all",'
            'backend="vllm"}), "group", "$1", "target", "(.+)") < 0.9',
        ),
    }, exprs
    out = tmp_path / "rules.yml"
    out.write_text(yaml.safe_dump(doc))
    # (--lint=none: an override splits a rule in two of the same name, which promtool's default lint reports
    # without failing; that is the same for rules over targets)
    check = subprocess.run(
        [promtool, "check", "rules", "--lint=none", str(out)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0 and "SUCCESS: 4 rules found" in check.stdout, check.stdout + check.stderr


TEMPLATES = [
    "{{ $value }}",
    "{{ $labels.target }} at {{ $value | humanizePercentage }}",
    '{{ printf "%.2f" $value }}',
    "a }} b",
    "{{ $value ",
    "x {{ $labels.target }} {{",
    "{{ $value | humanizeDuration }} {{ }",
    "{{- $value -}}",
    "{{ $value | title }}",
]


def test_annotation_templates_promtool_refuses_tuner_refuses_too(tmp_path):
    """tuner renders a subset of Prometheus's templates: on the same texts, what tuner's check accepts promtool
    accepts, and what promtool refuses (an unclosed action, ...) tuner's check refuses."""
    import yaml

    from tuner.rules.templates import check as tuner_check

    promtool = require_tool("promtool")
    verdicts = {}
    for i, text in enumerate(TEMPLATES):
        path = tmp_path / f"r{i}.yml"
        path.write_text(
            yaml.safe_dump(
                {
                    "groups": [
                        {"name": "g", "rules": [{"alert": "A", "expr": "vector(1)", "annotations": {"summary": text}}]}
                    ]
                }
            )
        )
        promtool_ok = (
            subprocess.run(
                [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
            ).returncode
            == 0
        )
        try:
            tuner_check(text)
            tuner_ok = True
        except ValueError:
            tuner_ok = False
        verdicts[text] = (promtool_ok, tuner_ok)
    assert not [t for t, (p, ok) in verdicts.items() if ok and not p], verdicts  # tuner accepts, promtool refuses
    assert not [t for t, (p, ok) in verdicts.items() if p and not ok and t != "{{ $value | title }}"], verdicts
    assert not verdicts["{{ $value "][0] and verdicts["{{ $value "] == verdicts["x {{ $labels.target }} {{"]
