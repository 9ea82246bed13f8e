"""The keep-or-roll-back rule (tuner/apply/verdict.py), case by case."""

from __future__ import annotations

import pytest

from tuner.apply.verdict import judge

BASE = {"goodput_ratio": 0.95, "ttft_p99": 0.40, "e2e_p99": 3.0, "tokens_per_s_per_running": 20.0,
        "requests_per_s": 2.0, "requests": 200}


def after(**changes):
    return {**BASE, **changes}


@pytest.mark.parametrize("changes, outcome, phrase", [
    ({}, "kept", "no regression"),
    ({"goodput_ratio": 0.99, "ttft_p99": 0.2}, "kept", "improved: goodput 0.950 -> 0.990"),
    ({"goodput_ratio": 0.85}, "rolled_back", "regressed: goodput 0.950 -> 0.850"),
    ({"goodput_ratio": 0.92}, "kept", "goodput 0.950 -> 0.920"),  # within the 0.05 tolerance
    ({"tokens_per_s_per_running": 15.0}, "rolled_back", "tokens/s per running request 20.0 -> 15.0"),
    ({"ttft_p99": 0.60}, "rolled_back", "P99 TTFT 0.400s -> 0.600s"),
    ({"ttft_p99": 0.54}, "kept", "P99 TTFT"),  # 1.25 x 0.40 + 0.05 = 0.55
    ({"e2e_p99": 5.0}, "rolled_back", "P99 E2E 3.000s -> 5.000s"),
    # load tripled: latency percentiles are not comparable, only the load-normalized KPIs are
    ({"e2e_p99": 5.0, "requests_per_s": 6.0}, "kept", "not compared"),
    ({"requests": 3, "goodput_ratio": 0.1}, "kept", "too little traffic to judge: 3 requests finished"),
])
def test_judge(changes, outcome, phrase):
    v = judge(BASE, after(**changes), min_requests=20)
    assert v.outcome == outcome, v.reason
    assert phrase in v.reason


def test_without_a_request_count_generated_tokens_measure_traffic():
    llama = {"tokens_per_s_per_running": 30.0, "requests": None}
    assert "tokens generated" in judge(llama, {**llama, "generated_tokens": 5.0}, min_requests=20).reason
    v = judge(llama, {**llama, "generated_tokens": 900.0, "tokens_per_s_per_running": 10.0}, min_requests=20)
    assert v.outcome == "rolled_back" and "30.0 -> 10.0" in v.reason


def test_no_baseline_keeps_and_says_so():
    v = judge({}, after(), min_requests=20)
    assert v.outcome == "kept" and "no baseline" in v.reason
