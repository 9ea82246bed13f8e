"""bench/spread_estimators.py's ``crossing``: where a search's runs cross the objective, from every run, at the search's
own speed. Checked against values worked out by hand: the interpolation in log rate, runs out of order pooled, the
speed scaling (a run that stepped slower counts as a higher load), and the two ends (nothing met, everything met)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.spread_estimators import crossing  # noqa: E402


def run(rate: float, good: int, sent: int, steps: dict[str, float] | None = None) -> dict:
    return {"rate_rps": rate, "good": good, "sent": sent, "step_s": steps}


def between(lo: float, hi: float, share: float) -> float:
    """The rate ``share`` of the way from lo to hi in log rate."""
    return math.exp(math.log(lo) + share * (math.log(hi) - math.log(lo)))


def test_crossing_is_interpolated_in_log_rate_between_the_met_and_the_missed_run() -> None:
    runs = [run(8.0, 100, 100), run(16.0, 100, 100), run(18.4, 60, 100)]
    # 100% at 16, 60% at 18.4: 0.95 lies 0.05 / 0.40 of the way down
    assert crossing(runs, 0.95) == pytest.approx(between(16.0, 18.4, 0.05 / 0.40))


def test_a_miss_below_a_met_rate_is_pooled_with_it() -> None:
    # 94% at 12 then 100% at 14 (noise): pooled into one point of 97% at sqrt(12 x 14); 50% at 16 after it
    runs = [run(12.0, 94, 100), run(14.0, 100, 100), run(16.0, 50, 100)]
    lo = math.sqrt(12.0 * 14.0)
    assert crossing(runs, 0.95) == pytest.approx(between(lo, 16.0, 0.02 / 0.47))


def test_runs_at_one_rate_count_as_one_point() -> None:
    runs = [run(10.0, 100, 100), run(12.0, 93, 100), run(12.0, 97, 100), run(14.0, 0, 100)]
    # 12 pooled: 95.0% exactly, which meets: the crossing lies between 12 and 14, at 12 itself
    assert crossing(runs, 0.95) == pytest.approx(12.0)


def test_a_run_that_stepped_slower_counts_as_a_higher_load() -> None:
    fast, slow = {"4": 1.0e-3, "8": 2.0e-3}, {"4": 1.5e-3, "8": 3.0e-3}
    runs = [run(16.0, 100, 100, fast), run(18.4, 60, 100, slow)]
    # the pool steps sqrt(1.5) slower than the fast run and sqrt(1.5) faster than the slow one
    s = math.sqrt(1.5)
    assert crossing(runs, 0.95) == pytest.approx(between(16.0 / s, 18.4 * s, 0.05 / 0.40))
    assert crossing(runs, 0.95, same_speed=False) == pytest.approx(between(16.0, 18.4, 0.05 / 0.40))


def test_a_run_whose_steps_say_too_little_keeps_its_rate() -> None:
    runs = [run(16.0, 100, 100, {"4": 1.0e-3}), run(18.4, 60, 100, None)]
    assert crossing(runs, 0.95) == pytest.approx(between(16.0, 18.4, 0.05 / 0.40))


def test_the_ends_nothing_met_and_everything_met() -> None:
    assert crossing([run(2.0, 50, 100), run(1.0, 90, 100)], 0.95) == 0.0
    assert crossing([run(2.0, 100, 100), run(4.0, 99, 100)], 0.95) == pytest.approx(4.0)
