"""bench/tune_spread.py: the spread it reports, and the worst deviation as its table prints it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.tune_spread import deviation, spread_of  # noqa: E402


def test_spread_of_five_capacities_two_rungs_apart():
    # the 14:16 bench on bursty.yaml: three servers one rung up, two one rung down
    s = spread_of([3.0844] * 3 + [2.5937] * 2)
    assert s["mean"] == pytest.approx(2.8881, abs=1e-4)
    assert s["worst"] == pytest.approx(0.1020, abs=1e-4)
    assert s["within_10"] is False


def test_a_deviation_just_past_the_bar_is_not_printed_as_the_bar():
    assert deviation(0.10195) == "±10.2%"  # rounded to a whole percent it read "±10%" beside "no"
    assert deviation(0.0951) == "±9.5%"
    assert deviation(0.1) == "±10%"
    assert deviation(0.08) == "±8%"
    assert deviation(0.1449) == "±14%"
