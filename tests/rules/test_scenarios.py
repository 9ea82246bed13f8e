"""Every scenario in tests/rules/scenarios/ must pass in tuner's evaluator AND in promtool (Prometheus 2.42)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import require_tool
from tuner.app.alert_scenarios import check_files, load_scenario, run

SCENARIOS = sorted(p for p in (Path(__file__).parent / "scenarios").glob("*.yaml") if not p.name.endswith(".rules.yaml"))


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
    text = text.replace("exp_alerts: []\n", "exp_alerts:\n      - exp_labels: {severity: critical, engine: \"0\", "
                        "model_name: m}\n", 1)
    text = text.replace("../../../alerts/default.yaml", str(Path(__file__).parents[2] / "alerts" / "default.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    tuner_failures, _ = run(load_scenario(bad))
    assert any("5m45s" in f for f in tuner_failures)
    both = check_files([str(bad)], promtool=promtool, workdir=tmp_path)[str(bad)]
    assert any("promtool disagrees" in f for f in both)
