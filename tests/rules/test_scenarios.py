"""Every scenario in tests/rules/scenarios/ must pass in tuner's evaluator AND in promtool (Prometheus 2.42)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import require_tool
from tuner.app.alert_scenarios import _ms, check_files, load_scenario, run
from tuner.rules.model import default_rule_files, load_rule_files

SCENARIOS = sorted(
    p for p in (Path(__file__).parent / "scenarios").glob("*.yaml") if not p.name.endswith(".rules.yaml")
)


def test_there_are_scenarios():
    assert len(SCENARIOS) >= 8


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario_passes_in_tuner_and_promtool(path, tmp_path):
    promtool = require_tool("promtool")
    failures = check_files([str(path)], promtool=promtool, workdir=tmp_path)[str(path)]
    assert failures == []


def test_a_wrong_expectation_fails_in_both(tmp_path):
    """The harness can fail: expect KVCacheHigh a step too early; tuner and promtool must both object."""
    promtool = require_tool("promtool")
    src = Path(__file__).parent / "scenarios" / "kv_cache_high.yaml"
    text = src.read_text().replace("eval_time: 5m\n", "eval_time: 5m45s\n", 1)
    text = text.replace(
        "exp_alerts: []\n", 'exp_alerts:\n      - exp_labels: {severity: critical, engine: "0", model_name: m}\n', 1
    )
    text = text.replace("../../../alerts/default.yaml", str(Path(__file__).parents[2] / "alerts" / "default.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    tuner_failures, _ = run(load_scenario(bad))
    assert any("5m45s" in f for f in tuner_failures)
    both = check_files([str(bad)], promtool=promtool, workdir=tmp_path)[str(bad)]
    assert any("promtool disagrees" in f for f in both)


def test_every_rule_of_the_default_pack_fires_in_a_scenario():
    """Each rule of alerts/default.yaml (by its key, group/alert: KVCacheHigh and EngineStalled are in two groups)
    fires in at least one scenario, where the scenario expects it to: the pack is tested rule by rule, in tuner
    and (test above) in promtool."""
    pack = load_rule_files(default_rule_files())
    keys = {g.key(r) for g in pack.groups for r in g.rules}
    fired: set[str] = set()
    for path in SCENARIOS:
        sc = load_scenario(path)
        failures, firing = run(sc)
        assert failures == [], failures
        for t in sc.tests:
            if t.get("exp_alerts"):
                fired |= {a["rule"] for a in firing.get(_ms(t["eval_time"]), {}).get(t["alertname"], [])}
    missing = sorted(keys - fired)
    assert not missing, f"rules of the default pack no scenario makes fire: {', '.join(missing)}"


@pytest.mark.parametrize(
    "name, alertname, eval_time, earlier",
    [("gpu.yaml", "GPUMemoryNearFull", "5m15s", "5m"), ("replica_group.yaml", "GroupWaiting", "1m15s", "1m")],
)
def test_gpu_and_group_expectations_a_step_early_fail_in_both(name, alertname, eval_time, earlier, tmp_path):
    """GPU readings and replica groups reach both engines: the same firing alert expected a step before it fires
    is refused by tuner and by promtool."""
    promtool = require_tool("promtool")
    src = Path(__file__).parent / "scenarios" / name
    text = src.read_text()
    block = f"  - eval_time: {eval_time}\n    alertname: {alertname}\n    exp_alerts:\n      - "
    assert block in text
    text = text.replace(block, block.replace(eval_time, earlier), 1)
    for rel in ("../../../alerts/default.yaml", "groups.rules.yaml"):
        text = text.replace(f"rules: {rel}", f"rules: {(src.parent / rel).resolve()}")
    bad = tmp_path / name
    bad.write_text(text)
    tuner_failures, _ = run(load_scenario(bad))
    assert any(f"at {earlier} {alertname}" in f for f in tuner_failures), tuner_failures
    both = check_files([str(bad)], promtool=promtool, workdir=tmp_path)[str(bad)]
    assert any("promtool disagrees" in f for f in both), both
