"""bench/runoff.py: which two configs a run-off sets against each other, which runs as the flags in force, and how
the comparison's A/B outcome reads back as "the grid's best" or "tune's decision". The inputs are written here in the
shape `tuner tune --json` prints (a real run-off takes ~12 minutes of two fresh vLLM servers); what is checked is
the bookkeeping, where a slip would credit the wrong side."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.runoff import grid_of, sampler_seed, sides, table, tally, verdict  # noqa: E402

BASE = {"max_model_len": 1024}
S16 = {**BASE, "max_num_seqs": 16, "max_num_batched_tokens": 2048}
S32 = {**BASE, "max_num_seqs": 32, "max_num_batched_tokens": 2048}
S1 = {**BASE, "max_num_seqs": 1, "max_num_batched_tokens": 256}


def _result(trials: list[tuple[dict, float]], baseline: dict, recommended: dict | None) -> dict:
    best = max(trials, key=lambda x: x[1])
    return {
        "trials": [{"flags": f, "capacity_rps": c, "status": "measured"} for f, c in trials],
        "best": {"flags": best[0], "capacity_rps": best[1]},
        "baseline": {"flags": baseline},
        "recommendation_id": None if recommended is None else 1,
        "comparison": None if recommended is None else {"flags": recommended},
        "counts": {"measured": len(trials), "crashed": 0, "pruned": 0},
    }


def _work(tmp_path: Path, tpe: dict) -> Path:
    work = tmp_path / "shape.poor"
    work.mkdir()
    grid = _result([(S1, 13.9), (S16, 32.0), (S32, 27.9)], {}, None)
    (work / "grid.json").write_text(json.dumps(grid))
    (work / "tpe.json").write_text(json.dumps(tpe))
    return work


def test_a_decision_below_the_grids_best_runs_off_against_it_with_the_grids_best_in_force(tmp_path: Path) -> None:
    work = _work(tmp_path, _result([(S1, 16.0), (S32, 32.0)], S1, S32))  # recommended 32, the grid read it 27.9
    two = sides(work)
    assert two is not None
    assert two["decision"] == {"max_num_seqs": 32, "max_num_batched_tokens": 2048}
    assert two["grid_best"] == two["in_force"] == {"max_num_seqs": 16, "max_num_batched_tokens": 2048}
    assert two["searched"] == two["decision"]
    assert two["score"] == pytest.approx(27.9 / 32.0)
    assert grid_of(two["searched"]) == "max_num_batched_tokens=2048,max_num_seqs=32"


def test_vllms_defaults_are_always_the_flags_in_force_since_a_grid_axis_cannot_say_unset(tmp_path: Path) -> None:
    # "keep the flags in force" from vLLM's defaults, which the search measured at 27.9
    work = _work(tmp_path, _result([(BASE, 27.9), (S32, 27.9)], BASE, None))
    two = sides(work)
    assert two is not None
    assert two["decision"] == two["in_force"] == {}
    assert two["searched"] == two["grid_best"] == {"max_num_seqs": 16, "max_num_batched_tokens": 2048}


def test_a_decision_that_is_the_grids_best_has_nothing_to_run_off(tmp_path: Path) -> None:
    assert sides(_work(tmp_path, _result([(S1, 16.0), (S16, 30.0)], S1, S16))) is None


@pytest.mark.parametrize(
    ("decision_in_force", "outcome", "expected"),
    [
        (False, "a_better", "the grid's best"),  # A is the grid's best
        (False, "b_better", "tune's decision"),
        (True, "a_better", "tune's decision"),  # A is vLLM's defaults, tune's decision
        (True, "b_better", "the grid's best"),
        (True, "same", "the same"),
        (False, "undecided", "no difference measurable"),
    ],
)
def test_the_comparisons_sides_read_back_as_the_configs_they_ran(
    decision_in_force: bool, outcome: str, expected: str
) -> None:
    best, decided = {"max_num_seqs": 16}, ({} if decision_in_force else {"max_num_seqs": 32})
    r = {
        "grid_best": best,
        "decision": decided,
        "in_force": decided if decision_in_force else best,
        "searched": best if decision_in_force else decided,
        "tune": {
            "trials": [{"flags": {**BASE, **best}}, {"flags": {**BASE, **decided}}],
            "comparison": {"outcome": outcome},
        },
    }
    assert verdict(r) == expected


def test_a_run_off_that_measured_neither_side_is_void_and_left_out_of_the_tally() -> None:
    # drawn-6446-1 from one sequence: 1/256 against 8/2048, whose 2 x 2 space let the sampler pick 8/256
    best, decided = (
        {"max_num_seqs": 8, "max_num_batched_tokens": 2048},
        {"max_num_seqs": 1, "max_num_batched_tokens": 256},
    )
    mixed = {"max_num_seqs": 8, "max_num_batched_tokens": 256}
    r = {
        "grid_best": best,
        "decision": decided,
        "in_force": best,
        "searched": decided,
        "tune": {
            "trials": [{"flags": {**BASE, **best}}, {"flags": {**BASE, **mixed}}],
            "comparison": {"outcome": "a_better"},
        },
    }
    assert verdict(r) == "void: tune measured another config"
    assert tally([(Path("x"), r)]).startswith("Run off side by side on fresh servers (0 runs)")


@pytest.mark.parametrize(
    ("in_force", "searched"),
    [
        ({"max_num_seqs": 8, "max_num_batched_tokens": 2048}, {"max_num_seqs": 1, "max_num_batched_tokens": 256}),
        ({"max_num_seqs": 1, "max_num_batched_tokens": 2048}, {"max_num_seqs": 8, "max_num_batched_tokens": 256}),
        ({}, {"max_num_seqs": 16, "max_num_batched_tokens": 256}),
        ({"max_num_seqs": 16, "max_num_batched_tokens": 256}, {"max_num_seqs": 32, "max_num_batched_tokens": 256}),
    ],
)
def test_the_sampler_seed_makes_tunes_own_search_measure_the_searched_side(in_force: dict, searched: dict) -> None:
    """tune's space holds the flags in force too: two sides differing in two flags make it 2 x 2. The seed is found
    with tune's own search; here that search is run again with it, as `tuner tune` runs it, and must pick the side."""
    from tuner.store.tuning import TrialStatus
    from tuner.tune.search import Outcome, search
    from tuner.tune.space import Verdict, canonical, vllm_axes

    seed = sampler_seed({"in_force": in_force, "searched": searched})
    current = canonical({**BASE, **in_force})
    axes = vllm_axes(current, longest=1, model_max_len=1024, on_gpu=False, names=grid_of(searched).split(","))
    differ = sum(in_force.get(k) != v for k, v in searched.items()) if in_force else 0
    assert math.prod(len(a.values) for a in axes) == 2**differ  # the space tune searches: 4 where both flags differ
    measured = []
    search(
        axes,
        {k: v for k, v in current.items() if k not in {a.name for a in axes}},
        measure=lambda flags, label: measured.append(flags) or Outcome(TrialStatus.MEASURED, 1.0, {}),
        feasible=lambda flags: Verdict(True, "", {}),
        seeds=[("baseline", current)],
        budget=2,
        max_time_s=1e9,
        clock=lambda: 0.0,
        seed=seed,
        sampler="random",
    )
    assert measured[-1] == canonical({**BASE, **searched})


def test_the_table_counts_each_side_at_the_comparisons_last_rate_only(tmp_path: Path) -> None:
    best, decided = {"max_num_seqs": 16}, {"max_num_seqs": 32}
    run = {"rate_rps": 30.0, "good": 38, "sent": 40}
    r = {
        "grid_best": best,
        "decision": decided,
        "score": 0.87,
        "grid_best_rps": 32.0,
        "in_force": best,
        "searched": decided,
        "wall_s": 720.0,
        "tune": {
            "trials": [
                {"flags": {**BASE, **best}, "capacity_rps": 27.9, "status": "measured", "interval": [27.9, 32.0]},
                {"flags": {**BASE, **decided}, "capacity_rps": 32.0, "status": "measured", "interval": [32.0, 36.8]},
            ],
            "comparison": {
                "outcome": "same",
                "pairs": 3,
                "rate_rps": 30.0,
                "runs": {
                    "A": [{"rate_rps": 36.0, "good": 10, "sent": 40}, run, run],
                    "B": [{"rate_rps": 36.0, "good": 12, "sent": 40}, run, {**run, "good": 40}],
                },
            },
        },
    }
    row = table([(tmp_path / "shape.poor", r)]).splitlines()[-1]
    assert "at 30 req/s: grid's best 76/80, decision 78/80" in row
    assert "| 32 (32-36.8), 27.9 (27.9-32) |" in row  # the decision's fresh capacity first
    assert "| the same |" in row and "| 87% |" in row


def test_the_tally_counts_each_verdict_once_and_the_undecided_apart() -> None:
    best, decided = {"max_num_seqs": 16}, {"max_num_seqs": 32}

    def r(outcome: str) -> tuple[Path, dict]:
        run = {"grid_best": best, "decision": decided, "in_force": best, "searched": decided}
        trials = [{"flags": {**BASE, **best}}, {"flags": {**BASE, **decided}}]
        return Path("x"), {**run, "tune": {"trials": trials, "comparison": {"outcome": outcome}}}

    line = tally([r("b_better"), r("same"), r("same"), r("a_better"), r("undecided")])
    assert line == (
        "Run off side by side on fresh servers (5 runs): tune's decision served more within the SLO than the grid's "
        "best in 1, as much in 2, less in 1, and no difference was measurable in 1."
    )


def test_the_choice_is_run_off_in_place_of_the_decision_and_said_so(tmp_path: Path) -> None:
    # tune measured 32 best (its choice) but kept 1 (its decision): the registered score scores the choice
    work = _work(tmp_path, _result([(S1, 16.0), (S32, 30.0)], S1, None))
    decision, choice = sides(work), sides(work, "choice")
    assert decision is not None and choice is not None
    assert decision["decision"] == {"max_num_seqs": 1, "max_num_batched_tokens": 256}
    assert choice["decision"] == choice["searched"] == {"max_num_seqs": 32, "max_num_batched_tokens": 2048}
    assert choice["subject"] == "choice" and choice["score"] == pytest.approx(27.9 / 32.0)
    r = {
        **choice,
        "grid_best_rps": 32.0,
        "wall_s": 60.0,
        "tune": {
            "trials": [
                {"flags": S16, "status": "measured", "capacity_rps": 32.0},
                {"flags": S32, "status": "measured", "capacity_rps": 32.0},
            ],
            "comparison": {"outcome": "same"},
        },
    }
    line = tally([(work, r)])
    assert line.startswith("Run off side by side on fresh servers (1 runs): tune's choice served more")
    assert "decision" not in table([(work, r)])
