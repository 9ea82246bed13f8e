"""Rule files: what loads, and that every bad file is rejected with its file, line and reason."""

from __future__ import annotations

import pytest

from tuner.errors import RuleFileError
from tuner.rules.model import default_rule_files, load_rule_files, parse_rules

GOOD = """\
groups:
  - name: g
    interval: 30s
    rules:
      - alert: A
        signal: kv_cache_usage
        op: ">"
        threshold: 0.9
"""


def test_default_pack_loads_with_the_rules_the_issue_names():
    rules = load_rule_files(default_rule_files())
    names = {r.alert for r in rules.rules}
    assert {
        "KVCacheHigh",
        "QueueDepthHigh",
        "QueueDepthHighRelative",
        "P99LatencyHigh",
        "TTFTHigh",
        "PreemptionsHigh",
        "TargetDown",
        "EngineRestarted",
        "GPUMemoryNearFull",
        "GPUSharedWithOtherProcess",
        "SlotsSaturated",
        "SLOBurn",
    } <= names


@pytest.mark.parametrize(
    "text, line, fragment",
    [
        (
            GOOD.replace("kv_cache_usage", "kv_usage"),
            5,
            "known signals: all_scrape_errors_per_minute, applies_per_hour, "
            "auto_apply_halted, auto_evaluations_missed, e2e_p50",
        ),
        (GOOD.replace('">"', '"=>"'), 5, "op '=>' is not one of"),
        (GOOD.replace("threshold: 0.9", "threshold: high"), 5, "threshold must be a number or 'slo'"),
        (GOOD.replace("threshold: 0.9", "threshold: slo"), 5, "threshold 'slo' works for"),
        (GOOD.replace("interval: 30s", "interval: soon"), 2, "interval: expected a duration"),
        (GOOD + "        for: 5 minutes\n", 5, "for: expected a duration"),
        (GOOD + "        severity: page\n", 5, "unknown key 'severity'"),
        (GOOD + "        annotations: {summary: '{{ $value | title }}'}\n", 5, "unsupported template action"),
        (GOOD + "        annotations: {summary: '{{ $value '}\n", 5, "annotations.summary: unclosed action"),
        (GOOD + "        annotations: {summary: 'at {{ $labels.target }}: {{'}\n", 5, "unclosed action '{{'"),
        (GOOD + "      - {alert: A, signal: up, op: '==', threshold: 0}\n", 9, "appears twice"),
        (
            GOOD.replace("      - alert: A\n", "      - alert: A\n        backend: llamacpp\n").replace(
                "kv_cache_usage", "preemptions_per_s"
            ),
            5,
            "no value for backend 'llamacpp'",
        ),
        (GOOD.replace("threshold: 0.9", "threshold: .nan"), 5, "A: threshold must be a finite number, got nan"),
        (GOOD.replace("threshold: 0.9", "threshold: -.inf"), 5, "A: threshold must be a finite number, got -inf"),
        (
            GOOD + "        overrides: {chat: {threshold: .inf}}\n",
            9,
            "overrides.chat.threshold must be a finite number",
        ),
        (GOOD.replace("alert: A", 'alert: "A\\n"'), 5, "is not a valid alert name"),
        (GOOD + '        labels: {"team\\n": x}\n', 9, "labels.'team\\n': expected a label name"),
        ("groups: [\n", 2, "not valid YAML"),
        ("rules: []\n", 1, "top-level 'groups:'"),
    ],
)
def test_bad_rule_file_names_file_line_and_reason(tmp_path, text, line, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(RuleFileError) as err:
        load_rule_files([path])
    assert err.value.path == str(path) and err.value.line == line, str(err.value)
    assert fragment in str(err.value)
    assert str(err.value).startswith(f"{path}:{line}: ")


def test_one_bad_file_loads_nothing(tmp_path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(GOOD)
    bad.write_text(GOOD.replace("name: g", "name: h").replace("kv_cache_usage", "nope"))
    with pytest.raises(RuleFileError):
        load_rule_files([good, bad])


def test_overrides_and_slo_thresholds():
    from tuner.config import parse_config

    cfg = parse_config(
        "targets:\n  - {name: a, backend: vllm, url: 'http://x:1', slo: {ttft_p99: 250ms}}\n"
        "  - {name: b, backend: vllm, url: 'http://x:2'}\n"
    )
    rules = parse_rules(
        GOOD.replace("threshold: 0.9", "threshold: 0.9\n        overrides: {b: {threshold: 0.5, for: 2m}}")
        + "      - {alert: T, signal: ttft_p99, op: '>', threshold: slo}\n"
    )
    a, t = rules.rules
    assert (a.threshold_for(cfg.targets[0]), a.threshold_for(cfg.targets[1])) == (0.9, 0.5)
    assert a.hold_for("b").total_seconds() == 120 and a.hold_for("a").total_seconds() == 0
    assert (t.threshold_for(cfg.targets[0]), t.threshold_for(cfg.targets[1])) == (0.25, None)


_RULE = "      - {alert: A, signal: kv_cache_usage, op: '>', threshold: %s}\n"


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        pytest.param("groups:\n  - name: [1]\n    rules: []\n", 2, "group name must be a string", id="list-name"),
        pytest.param(
            "groups:\n  - name: g\n    rules:\n" + _RULE % ("9" * 400),
            4,
            "threshold " + "9" * 400 + " is too large",
            id="huge-threshold",
        ),
        pytest.param(
            "groups:\n  - name: g\n    interval: 99999999999d\n    rules: []\n",
            2,
            "longer than ten years",
            id="huge-interval",
        ),
        pytest.param(
            "groups:\n  - name: g\n    rules: []\n  - 7\n",
            1,
            "groups[1]: each group needs a name",
            id="group-not-a-mapping",
        ),
        pytest.param("groups:\n  - name: 2001-02-30\n    rules: []\n", 2, "cannot read '2001-02-30'", id="bad-date"),
    ],
)
def test_files_that_crashed_the_loader_name_their_line(text: str, line: int, reason: str) -> None:
    """Found by tests/reliability/test_fuzz.py: TypeError (unhashable name), OverflowError and ValueError escaped
    the loader, and a group that is not a mapping had no line."""
    with pytest.raises(RuleFileError) as info:
        parse_rules(text, "r.yaml")
    assert info.value.line == line and reason in info.value.reason, info.value


def test_over_groups_is_for_engine_signals_and_names_its_values():
    from tuner.errors import RuleFileError

    ok = parse_rules(
        "groups:\n  - name: g\n    rules:\n      - {alert: A, signal: e2e_p99, op: '>', threshold: 2, over: groups}\n"
    )
    assert ok.rules[0].over == "groups"
    assert (
        parse_rules("groups:\n  - name: g\n    rules:\n      - {alert: A, signal: e2e_p99, op: '>', threshold: 2}\n")
        .rules[0]
        .over
        == "targets"
    )
    with pytest.raises(RuleFileError, match="over: 'replicas' is not 'targets' or 'groups'"):
        parse_rules(
            "groups:\n  - name: g\n    rules:\n"
            "      - {alert: A, signal: e2e_p99, op: '>', threshold: 2, over: replicas}\n"
        )
    with pytest.raises(RuleFileError, match="over: groups works for engine signals only"):
        parse_rules(
            "groups:\n  - name: g\n    rules:\n      - {alert: A, signal: up, op: '==', threshold: 0, over: groups}\n"
        )


def test_a_rule_file_that_is_not_utf8_is_one_error_naming_the_file(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(GOOD.replace("alert: A", "alert: A\n        labels: {team: caf\xe9}").encode("latin-1"))
    with pytest.raises(RuleFileError) as err:
        load_rule_files([path])
    assert str(err.value) == f"{path}: not UTF-8 text: byte 0xe9 on line 6 (save the file as UTF-8)"


def test_a_tuner_signal_takes_no_overrides_and_a_target_signal_may_be_kept_to_one_backend(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        "groups:\n  - name: g\n    rules:\n      - {alert: A, signal: all_scrape_errors_per_minute, "
        "op: '>', threshold: 10, overrides: {chat: {threshold: 1}}}\n"
    )
    with pytest.raises(
        RuleFileError,
        match=r"r.yaml:4: A: all_scrape_errors_per_minute has one value for the whole "
        r"tuner: overrides by target do not apply",
    ):
        load_rule_files([path])
    (rule,) = parse_rules(
        "groups: [{name: g, rules: [{alert: S, signal: serving_stalled, op: '==', threshold: 1, backend: llamacpp}]}]"
    ).rules
    assert (rule.scope, rule.backend) == ("target", "llamacpp")
