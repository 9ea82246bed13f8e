"""What one run of vLLM's benchmark client says: each request met or missed, in the order sent, and how sure the
run's attainment is when misses come in clumps.

Read from a result file the real client saved (tests/fixtures/bench-client/README.md): a bursty run (gamma arrivals,
shape 0.25) at the capacity of a 2-sequence server, where requests that arrive together queue together.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from tuner.backends import BACKENDS
from tuner.config import Slo
from tuner.signals.workload import Workload
from tuner.tune.bench import attainment, attainment_se, bench_args, outcomes, read_result

FIXTURE = Path(__file__).parents[1] / "fixtures" / "bench-client" / "bursty_seqs2_at_capacity.json"


def _slo_at_p95_ttft(data: dict) -> tuple[Slo, float]:
    """A TTFT budget this run met for 95% of its requests (the 95th percentile of its own TTFTs)."""
    ttfts = sorted(data["ttfts"])
    p95 = ttfts[math.ceil(0.95 * len(ttfts)) - 1]
    return Slo(ttft_p99=f"{p95 * 1000:.3f}ms", e2e_p99="60s", objective=0.95), p95


def test_outcomes_are_each_request_in_the_order_sent_and_add_up_to_the_attainment():
    data = json.loads(FIXTURE.read_text())
    slo, _ = _slo_at_p95_ttft(data)
    budget = slo.ttft_p99.total_seconds()
    met = outcomes(data, slo)
    assert 0.9 < sum(met) / len(met) < 0.97  # the budget sits at the run's own P95 (to a microsecond)
    assert len(met) == data["num_prompts"] == 271
    assert met == [t <= budget for t in data["ttfts"]]  # no request failed: TTFT alone decides here
    assert (sum(met), len(met)) == attainment(data, slo)
    assert data["start_times"] == sorted(data["start_times"])  # the client's lists are in the order sent
    # a request the result holds no timings for (sent, never answered) is a miss
    short = {**data, "latencies": data["latencies"][:-3]}
    assert outcomes(short, slo)[-3:] == [False] * 3 and len(outcomes(short, slo)) == 271


def test_clumped_misses_widen_the_standard_error_beyond_the_binomial():
    """At a budget its P95 TTFT met, the bursty run's misses fall in the bursts: its blocks of consecutive requests
    spread more than twice what independent requests would; the same outcomes shuffled spread about as the binomial
    says (what the batch means add is the clumping, not noise of their own)."""
    data = json.loads(FIXTURE.read_text())
    slo, _ = _slo_at_p95_ttft(data)
    met = outcomes(data, slo)
    p = sum(met) / len(met)
    binomial = math.sqrt(p * (1 - p) / len(met))
    se = attainment_se(met)
    assert se is not None and se > 2 * binomial
    shuffled = []
    for seed in range(200):
        mixed = list(met)
        random.Random(seed).shuffle(mixed)
        shuffled.append(attainment_se(mixed))
    assert 0.7 < sum(shuffled) / len(shuffled) / binomial < 1.1
    # the run read as tuner reads it carries the same figure
    run = read_result(FIXTURE, slo, 22.6274)
    assert run.attainment_se == pytest.approx(se) and run.as_json()["attainment_se"] == run.attainment_se


def test_too_few_requests_for_four_blocks_say_nothing():
    assert attainment_se([True] * 39) is None
    assert attainment_se([True] * 40) == 0.0
    assert attainment_se([True, False] * 20) == 0.0  # every block of 10 holds 5 of each: no spread between blocks
    assert attainment_se([True] * 20 + [False] * 20) == pytest.approx(math.sqrt(1 / 3 / 4))  # 1, 1, 0, 0


def test_about_the_trend_a_steady_slide_is_no_spread_and_the_real_clumps_remain():
    """A share that falls block by block along a line (a queue growing through the run) spreads the blocks about
    their mean, not about the line; the saved bursty run's clumps are not a line and stay more than twice the
    binomial error about it too."""
    slide = [i % 10 >= k for k in range(10) for i in range(10)]  # block k meets 10 - k of 10
    assert attainment_se(slide) > 0.09 and attainment_se(slide, detrend=True) == pytest.approx(0.0, abs=1e-12)
    assert attainment_se([True] * 39, detrend=True) is None
    data = json.loads(FIXTURE.read_text())
    slo, _ = _slo_at_p95_ttft(data)
    met = outcomes(data, slo)
    p = sum(met) / len(met)
    detrended = attainment_se(met, detrend=True)
    assert detrended is not None and detrended > 2 * math.sqrt(p * (1 - p) / len(met))
    assert read_result(FIXTURE, slo, 22.6274).attainment_se_detrended == pytest.approx(detrended)


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_the_client_closes_its_connections_where_the_backend_asks(name):
    """llama-server: a new connection per request (kept-alive ones failed 1-2% of requests at 30-45 req/s,
    tests/integration/test_bench_keepalive.py); vLLM: the client's own keep-alive, as vLLM's docs run it."""
    closes = BACKENDS[name].bench_closes_connections
    assert closes == (name == "llamacpp")
    args = bench_args(
        Workload(input_len=8, output_len=4),
        url="http://127.0.0.1:1",
        model="m",
        tokenizer="t",
        rate=1.0,
        prompts=10,
        slo=Slo(e2e_p99="5s"),
        result_dir=Path("/tmp"),
        result_file="r.json",
        close_connections=closes,
    )
    pairs = list(zip(args, args[1:]))
    assert (("--header", "Connection=close") in pairs) == closes
