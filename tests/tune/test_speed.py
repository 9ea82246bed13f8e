"""The server's step time read from the benchmark client's timings (tuner/tune/speed.py), and what a search does with
it (tuner/tune/capacity.py).

The timelines here come from a small decode loop whose step time is known (a function of how many requests decode
in it), in the client's own result format, so a test can say the answer is right. On real servers the same reading
ran in bench/host_drift.py (bench/results/2026-11-28-2232-host-drift.md).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.tune.test_capacity import Run as CapacityRun
from tuner.tune.capacity import Ladder, find_capacity
from tuner.tune.speed import pooled, slowdown, spread, step_times

FIXTURE = Path(__file__).parents[1] / "fixtures" / "bench-client" / "bursty_seqs2_at_capacity.json"


def step_of(k: int) -> float:
    """The decode loop's step time with ``k`` requests in it: 2 ms + 0.5 ms a request."""
    return 0.002 + 0.0005 * k


def client_result(
    arrivals: list[float], tokens: int, *, slots: int = 8, slower: float = 1.0, prefill_s: float = 0.003
) -> dict[str, list]:
    """Serve ``arrivals`` with a decode loop of ``slots`` slots whose steps take ``slower`` x step_of(requests in
    the step), each request ``tokens`` tokens long; return what the client would save: start_times, ttfts, itls."""
    t, queue, running = 0.0, list(range(len(arrivals))), {}
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    itls: dict[int, list[float]] = {i: [] for i in range(len(arrivals))}
    left = {i: tokens for i in range(len(arrivals))}
    while queue or running:
        if not running and queue and arrivals[queue[0]] > t:
            t = arrivals[queue[0]]
        joining = [i for i in queue if arrivals[i] <= t][: slots - len(running)]
        for i in joining:
            queue.remove(i)
        t += prefill_s * len(joining) if joining else 0.0
        for i in joining:  # the first token comes out of the prefill
            first[i] = last[i] = t
            left[i] -= 1
            running[i] = True
        if not running:
            continue
        t += slower * step_of(len(running))
        for i in list(running):
            itls[i].append(t - last[i])
            last[i] = t
            left[i] -= 1
            if left[i] <= 0:
                del running[i]
    n = len(arrivals)
    return {
        "start_times": arrivals,
        "ttfts": [first[i] - arrivals[i] for i in range(n)],
        "itls": [itls[i] for i in range(n)],
        "num_prompts": n,
    }


def poisson(rate: float, n: int, seed: int) -> list[float]:
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def test_the_step_time_at_each_concurrency_is_the_loops_own():
    steps = step_times(client_result(poisson(40.0, 300, 1), 40))
    assert len(steps) >= 4  # a loaded loop visits several concurrencies
    for k, s in steps.items():
        assert s == pytest.approx(step_of(k), rel=0.01), k


def test_a_slower_host_reads_slower_at_equal_concurrency_and_a_fuller_batch_does_not():
    """The same arrivals on a loop 1.4x slower read 1.4x slower. The same loop at twice the rate has fuller
    batches, so its median gap over all tokens is longer, but at equal concurrency it reads the same speed."""
    arrivals = poisson(30.0, 300, 2)
    fast, slow = step_times(client_result(arrivals, 40)), step_times(client_result(arrivals, 40, slower=1.4))
    assert slowdown(fast, slow) == pytest.approx(1.4, rel=0.01)
    assert slowdown(slow, fast) == pytest.approx(1 / 1.4, rel=0.01)
    quieter, busier = client_result(poisson(12.0, 300, 3), 40), client_result(poisson(60.0, 300, 3), 40)

    def median_gap(r: dict[str, list]) -> float:
        gaps = sorted(g for x in r["itls"] for g in x)
        return gaps[len(gaps) // 2]

    assert median_gap(busier) > 1.2 * median_gap(quieter)
    assert slowdown(step_times(quieter), step_times(busier)) == pytest.approx(1.0, abs=0.02)


def test_one_level_thrown_off_by_a_long_prefill_does_not_move_the_answer():
    a = {1: 0.003, 2: 0.004, 3: 0.005, 4: 0.006, 5: 0.007}
    b = {c: 1.3 * s for c, s in a.items()} | {4: 0.025}
    assert slowdown(a, b) == pytest.approx(1.3)


def test_stored_step_times_read_back_with_string_keys_and_nonsense_is_left_out():
    a = {1: 0.003, 2: 0.004}
    stored = json.loads(json.dumps(a)) | {"x": 1, "3": -1.0, "4": None}
    assert slowdown(stored, {"1": 0.006, "2": 0.008}) == pytest.approx(2.0)
    assert slowdown(a, {7: 0.01}) is None and slowdown(None, a) is None
    assert pooled([{1: 0.002}, {"1": 0.008, 2: 0.01}, None]) == pytest.approx({1: 0.004, 2: 0.01})
    assert spread([a, {1: 0.0045, 2: 0.006}, {9: 1.0}]) == pytest.approx(1.5)
    assert spread([a, None]) is None


def test_a_saved_result_without_gaps_reads_no_speed():
    """The real client's file in tests/fixtures had its ``itls`` emptied to keep it small: no gap, no speed."""
    assert step_times(json.loads(FIXTURE.read_text())) == {}


@dataclass(frozen=True)
class Run(CapacityRun):
    step_s: dict[int, float] = field(default_factory=dict)


def drifting_server(capacity_at_full_speed: float, seed: int, slow: float = 1.5):
    """A server whose host gives it full speed or ``slow`` times less, at random from run to run; at slowness s it
    meets the SLO up to capacity / s (its capacity is its step time's inverse). ``truth[i]``: run i's capacity."""
    rng, truth = random.Random(seed), []

    def measure(rate: float) -> Run:
        s = rng.choice([1.0, slow])
        truth.append(capacity_at_full_speed / s)
        good = 200 if rate <= truth[-1] else 120
        return Run(rate, 200, good, good / 200, step_s={k: s * step_of(k) for k in range(1, 9)})

    return measure, truth


def test_a_capacity_measured_on_a_drifting_host_keeps_the_truth_inside_its_interval():
    """On a host whose speed moves 1.5x between runs, the rate met and the rate missed were often measured at
    different speeds: the interval must still hold the capacity at the speed of the run that met. [lo, hi] alone
    misses it in some searches (a miss on a slow host at a rate the fast host meets); [lo, hi_same_speed] never."""
    raw_wrong = 0
    for seed in range(60):
        measure, truth = drifting_server(7.3, seed)
        cap = find_capacity(measure, 0.95, start_rps=2.0, tolerance=0.1, max_runs=8)
        if cap.lo_rps is None or cap.hi_rps is None:
            continue
        ladder = Ladder.for_tolerance(0.1)
        met = next(i for i, r in enumerate(cap.runs) if r.rate_rps == cap.lo_rps)
        at_met_speed = truth[met]
        assert cap.lo_rps <= at_met_speed
        assert cap.hi_same_speed_rps is not None and at_met_speed < cap.hi_same_speed_rps, seed
        raw_wrong += not at_met_speed < cap.hi_rps
        assert cap.speed_spread == pytest.approx(1.5) or cap.speed_spread == pytest.approx(1.0)
        if cap.hi_same_speed_rps > cap.hi_rps:
            assert "slower at the rate it missed" in cap.note
        assert ladder.nearest(cap.lo_rps) == pytest.approx(cap.lo_rps)  # the search itself is unchanged
    assert raw_wrong >= 5  # the case is real: without the speed, the interval lies about the capacity


def test_a_steady_host_leaves_the_interval_as_it_was():
    measure, _ = drifting_server(7.3, 0, slow=1.0)
    cap = find_capacity(measure, 0.95, start_rps=2.0, tolerance=0.1, max_runs=8)
    assert cap.speed_spread == pytest.approx(1.0) and cap.hi_same_speed_rps == cap.hi_rps
    assert "slower" not in cap.note


def test_runs_that_do_not_say_their_speed_leave_it_unknown():
    def measure(rate: float) -> Run:
        good = 200 if rate <= 5.0 else 100
        return Run(rate, 200, good, good / 200)

    cap = find_capacity(measure, 0.95, start_rps=2.0, tolerance=0.1, max_runs=8)
    assert cap.speed_spread is None and cap.hi_same_speed_rps == cap.hi_rps
    assert cap.as_json()["speed_spread"] is None


def test_steps_that_ran_a_prefill_are_left_out():
    """A prefill of 20 ms lengthens the gap of every request decoding beside it; read with those steps, a busier
    run looks like a slower host."""
    result = client_result(poisson(25.0, 300, 4), 40, prefill_s=0.02)
    with_prefills = step_times(result, pure=False)
    assert any(s > 1.2 * step_of(k) for k, s in with_prefills.items())
    for k, s in step_times(result).items():
        assert s == pytest.approx(step_of(k), rel=0.01), k


def test_runs_that_share_one_concurrency_are_not_compared():
    assert slowdown({1: 0.003, 2: 0.004}, {2: 0.008, 9: 0.02}) is None


def test_tokens_the_client_read_together_are_not_steps():
    """A client that falls behind reads several tokens at once: their gaps are microseconds and the gap before them
    holds the chunk. Here an overloaded run's drain (no request joins any more, and 7 down to 1 request decode) is read
    four tokens at a time, as the 20:56 bench's overloaded run at 24 req/s read 3-us "steps" at 1-4 sequences: a
    level read only from such chunks says nothing, and every level that reads reads the loop's own step."""
    result = client_result(poisson(200.0, 200, 5), 120)
    last_join = max(s + t for s, t in zip(result["start_times"], result["ttfts"], strict=True))
    chunked = []
    for s, t, gaps in zip(result["start_times"], result["ttfts"], result["itls"], strict=True):
        at, out, held = s + t, [], []
        for g in gaps:
            at += g
            if at <= last_join:
                out.append(g)
                continue
            held.append(g)
            if len(held) == 4:  # the four arrive at once, when the last of them was ready
                out += [sum(held) - 3 * 3e-6, 3e-6, 3e-6, 3e-6]
                held = []
        chunked.append(out + held)
    late = {**result, "itls": chunked}
    steps = step_times(late, min_gaps=10)  # the drain's levels hold tens of gaps, not MIN_GAPS
    assert len(steps) >= 2  # before the fix: 3 us at 4 and 6 sequences, where every gap was a chunk's
    for k, v in steps.items():
        assert v == pytest.approx(step_of(k), rel=0.02), k
    assert spread([step_times(result, min_gaps=10), steps]) == pytest.approx(1.0, abs=0.02)
