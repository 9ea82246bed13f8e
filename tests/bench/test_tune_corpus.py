"""bench/tune_corpus.py --score: issue 40 item 6's table from bench/tune.py's three result files per run, the
held-back shapes apart. The inputs are written here in the shape `tuner tune --json` prints (the real runs take
an hour a shape); what is checked is the arithmetic and which shape lands in which set."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.tune_corpus import draw_shapes, score, score_run  # noqa: E402


def _run(trials: list[tuple[dict, float | None]], baseline: dict, crashed: int = 0) -> dict:
    measured = [(f, c) for f, c in trials if c is not None]
    best = max(measured, key=lambda x: x[1]) if measured else None
    return {
        "trials": [
            {"flags": f, "capacity_rps": c, "status": "measured" if c is not None else "crashed"} for f, c in trials
        ],
        "best": {"flags": best[0], "capacity_rps": best[1]} if best else None,
        "baseline": {"flags": baseline},
        "counts": {"measured": len(measured), "crashed": crashed, "pruned": 0},
        "wall_s": 600.0,
    }


def _write(work: Path, grid: dict, tpe: dict, rnd: dict) -> Path:
    work.mkdir(parents=True)
    for name, r in (("grid", grid), ("tpe", tpe), ("random", rnd)):
        (work / f"{name}.json").write_text(json.dumps(r))
    return work


BASE = {"max_model_len": 1024}
S1, S4, S8 = ({**BASE, "max_num_seqs": n} for n in (1, 4, 8))


def test_a_run_scores_the_choice_by_the_grids_own_capacity_of_it(tmp_path: Path) -> None:
    # the grid measured four points (the baseline, 1, 4, 8); tune chose 4 on its own measurement (9.0, luckier than
    # the grid's 8.0), so its choice counts at the grid's 8.0 against the grid's best 10.0: 80%, not 90%
    grid = _run([(BASE, 5.0), (S1, 2.0), (S4, 8.0), (S8, 10.0)], BASE)
    tpe = _run([(BASE, 4.0), (S4, 9.0)], BASE)
    rnd = _run([(BASE, 6.0), (S1, 2.5), ({**BASE, "max_num_seqs": 3}, None)], BASE, crashed=1)
    r = score_run(_write(tmp_path / "chat.defaults", grid, tpe, rnd))
    assert r["grid_best"] == 10.0 and r["grid_best_flags"] == S8
    assert r["tpe"] == pytest.approx(0.8) and r["tpe_trials"] == 2 and r["grid_trials"] == 4
    assert r["random"] == pytest.approx(0.5) and r["random_trials"] == 3 and r["crashes"] == 1
    assert r["baseline_again"] == [5.0, 4.0, 6.0]  # the flags in force, on three fresh servers
    assert r["worst_repeat"] == pytest.approx(0.2)  # 4.0 and 6.0 against their mean 5.0 (S1: 2.0/2.5, ±11%)
    assert r["minutes"] == 30.0


def test_a_capacity_of_0_is_a_bound_not_a_repeat(tmp_path: Path) -> None:
    # held-back long-gen: one sequence served nothing down to the floor in the grid and in tpe (0 and 0: the spread
    # divided by a mean of 0), and 4 sequences read 1.42 in the grid, 0 in tpe (its runs spent halving from 15.6)
    grid = _run([(S1, 0.0), (S4, 1.42), (S8, 2.84)], BASE)
    tpe = _run([(S1, 0.0), (S4, 0.0), (S8, 3.31)], S1)
    r = score_run(_write(tmp_path / "long-gen.poor", grid, tpe, _run([(S8, 2.5)], S1)))
    assert r["baseline_again"] == [0.0, 0.0]
    assert r["worst_repeat"] == pytest.approx(3.31 / ((2.84 + 3.31 + 2.5) / 3) - 1)  # S8 alone: 2.84, 3.31, 2.5


def test_the_table_keeps_the_held_back_shapes_apart(tmp_path: Path) -> None:
    grid = _run([(BASE, 5.0), (S4, 8.0), (S8, 10.0)], BASE)
    _write(tmp_path / "rag.defaults", grid, _run([(BASE, 5.0), (S8, 10.5)], BASE), _run([(BASE, 5.0)], BASE))
    _write(tmp_path / "tiny-out.poor", grid, _run([(S1, 1.0), (S4, 8.0)], S1), _run([(S1, 1.0)], S1))
    (tmp_path / "not-a-run").mkdir()
    text = score(tmp_path, held=["tiny-out"])
    lines = text.splitlines()
    rag = next(line for line in lines if line.startswith("| rag |"))
    tiny = next(line for line in lines if line.startswith("| tiny-out |"))
    # neither search stored a recommendation: what tune told the user was "keep the flags in force"
    assert "| built on | defaults |" in rag and "| 100% (max_num_seqs=8) | 50% (vLLM's defaults) | 2/3 |" in rag
    assert (
        "| held back | poor |" in tiny and "| 80% (max_num_seqs=4) | 10% (max_num_seqs=1*) | 2/3 |" in tiny
    )  # S1: off the grid
    assert lines.index(rag) < lines.index(tiny)  # the held-back rows come last, after the ones built on
    assert "Built on (1 runs): tune's choice reaches 100%-100% of the grid's best (at least 95% in 1 of 1)" in text
    assert "Held back (1 runs): tune's choice reaches 80%-80% of the grid's best (at least 95% in 0 of 1)" in text


def test_the_decision_is_what_tune_told_the_user_to_run_not_its_luckiest_measurement(tmp_path: Path) -> None:
    """short-chat from vLLM's defaults (2026-11-27): the search's best measured was 8 sequences (10.9 req/s against
    the defaults' stall-hit 7.06), but tune stored no recommendation ("keep the flags in force": not beyond the two
    intervals), and the defaults were the best config there. The choice scores the first, the decision the second;
    with a recommendation stored, the decision is the config it names (the one judged in turns)."""
    grid = _run([(BASE, 10.0), (S4, 6.0), (S8, 8.0)], BASE)
    tpe = _run([(BASE, 5.0), (S8, 9.0)], BASE)
    r = score_run(_write(tmp_path / "a.defaults", grid, tpe, _run([(BASE, 9.0)], BASE)))
    assert r["tpe"] == pytest.approx(0.8) and r["tpe_decision"] == pytest.approx(1.0)
    assert r["tpe_decision_flags"] == BASE
    told = {**_run([(BASE, 5.0), (S8, 9.0), (S4, 7.0)], BASE), "recommendation_id": 3}
    told["comparison"] = {"flags": S4, "outcome": "b_better"}  # the one compared in turns and recommended
    r = score_run(_write(tmp_path / "b.defaults", grid, told, _run([(BASE, 9.0)], BASE)))
    assert r["tpe"] == pytest.approx(0.8) and r["tpe_decision"] == pytest.approx(0.6) and r["tpe_decision_flags"] == S4


def test_a_run_without_the_random_search_scores_tune_alone(tmp_path: Path) -> None:
    grid = _run([(BASE, 5.0), (S4, 8.0), (S8, 10.0)], BASE)
    work = _write(tmp_path / "long-gen.defaults", grid, _run([(BASE, 5.5), (S8, 9.0)], BASE), {})
    (work / "random.json").unlink()  # `bench/tune.py --skip random`
    r = score_run(work)
    assert (r["tpe"], r["random"], r["random_trials"], r["baseline_again"]) == (1.0, None, None, [5.0, 5.5])
    (row,) = [line for line in score(tmp_path, held=["long-gen"]).splitlines() if line.startswith("| long-gen")]
    assert row.split(" | ")[7] == "-"  # the random search's column


def test_a_folder_without_runs_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no bench/tune.py workdir"):
        score(tmp_path, held=[])


def test_the_summary_row_reads_what_the_table_says(tmp_path: Path) -> None:
    from bench import summary

    grid = _run([(BASE, 5.0), (S4, 8.0), (S8, 10.0)], BASE)
    _write(tmp_path / "tiny-out.defaults", grid, _run([(BASE, 5.0), (S4, 8.2)], BASE), _run([(BASE, 5.0)], BASE))
    figure = summary.tune_corpus(score(tmp_path, held=["tiny-out"]))
    assert (
        figure
        == "held back: 80%-80% of the grid's best (≥ 95% in 0 of 1 runs), 67% of its trials; built on: not scored"
    )
    assert summary.tune_corpus("no table here") is None
    tally = "Every held-back run to date (3 draws, each scored with the code of its day): 7 of 12 reach at least 95%"
    assert summary.tune_corpus(score(tmp_path, held=["tiny-out"]) + "\n" + tally + " of the grid's best.\n") == (
        figure + "; every held-back run to date (3 draws, each scored with the code of its day): ≥ 95% in 7 of 12"
    )


def test_a_choice_off_the_grid_is_scored_by_the_searches_own_measurements_of_it(tmp_path: Path) -> None:
    # `--sampler grid` does not visit vLLM's defaults (BASE here): when tune keeps them, their capacity is the mean of
    # what tpe and random measured of them (11.0 and 13.0: 12.0), which also tops the grid's 10.0
    grid = _run([(S1, 2.0), (S4, 8.0), (S8, 10.0)], S1)
    tpe = _run([(BASE, 11.0), (S8, 9.0)], BASE)
    rnd = _run([(BASE, 13.0), (S4, 7.0)], BASE)
    r = score_run(_write(tmp_path / "tiny-out.defaults", grid, tpe, rnd))
    assert r["grid_best"] == 12.0 and r["grid_best_flags"] == BASE and r["grid_best_off_grid"]
    assert r["tpe"] == 1.0 and r["tpe_off_grid"] and r["random"] == 1.0
    assert r["baseline_again"] == [11.0, 13.0]
    text = score(tmp_path, held=[])
    assert "| 12 req/s (vLLM's defaults*) | 100% (vLLM's defaults*) |" in text and "\\* off the grid" in text


def test_a_llama_server_run_names_llama_servers_defaults_and_hides_the_context_every_trial_had(tmp_path: Path) -> None:
    # bench/tune.py --backend llamacpp gives every trial -c 16384 and records the backend in its result files
    ctx = {"ctx_size": 16384}
    p1, p8 = ({**ctx, "parallel": n} for n in (1, 8))
    runs = [_run([(p1, 3.0), (p8, 9.0)], ctx), _run([(ctx, 7.0), (p8, 8.5)], ctx), _run([(ctx, 7.4)], ctx)]
    for r in runs:
        r["backend"] = "llamacpp"
    r = score_run(_write(tmp_path / "rag.llama-defaults", *runs))
    assert r["backend"] == "llamacpp" and r["tpe"] == 1.0 and r["grid_best_flags"] == p8
    row = next(line for line in score(tmp_path, held=[]).splitlines() if line.startswith("| rag |"))
    assert "| llama-defaults | 9 req/s (parallel=8) | 100% (parallel=8) |" in row
    # tune kept the defaults (off the grid: 7.0 and 7.4 measured, 7.2 of 9)
    assert "| 80% (llama-server's defaults*) |" in row and "ctx_size" not in row and "vLLM" not in row


def test_bench_tune_writes_a_llama_server_target_tuner_accepts(tmp_path: Path) -> None:
    """The config bench/tune.py --backend llamacpp writes is one tuner's own parser takes, with the flags in force
    and the fixed context beside them, one compute thread, and the GGUF as the model."""
    import bench.tune as bt
    from tuner.config import load_config

    wl = tmp_path / "w.yaml"
    wl.write_text("source: store\ninput_len: 64\noutput_len: 8\n")
    name = bt.add_file_workload(
        argparse.Namespace(
            workload_file=str(wl), name="w", slo=None, grid=None, in_force='{"parallel": 1}', backend="llamacpp"
        )
    )
    assert bt.WORKLOADS[name][2] == bt.LLAMA_GRID
    servers = bt.Servers("llamacpp", "/opt/vllm/bin/python", "/m/tiny", "/opt/llama-server", "/m/tiny.gguf")
    cfg = load_config(bt.write_config(tmp_path, name, servers))
    (t,) = cfg.targets
    assert t.backend == "llamacpp" and t.managed is not None
    assert t.managed.model == "/m/tiny.gguf" and t.managed.executable == "/opt/llama-server"
    assert t.managed.flags == {"ctx_size": bt.LLAMA_CTX, "parallel": 1}
    assert bt.LLAMA_CTX // 16 >= 1024  # every slot of the grid's largest --parallel holds max-model-len
    assert (tmp_path / "workload.yaml").read_text() == wl.read_text()


def test_drawn_shapes_are_the_seeds_and_every_request_fits_max_model_len() -> None:
    """--draw: the same seed draws the same shapes (the draw is recorded, and can be checked after), other seeds
    others; every shape's longest request (prompt and output at the top of their spread) fits 1024 tokens."""
    shapes = {seed: draw_shapes(6, seed) for seed in range(40)}
    assert draw_shapes(6, 3) == shapes[3] and len({json.dumps(s, sort_keys=True) for s in shapes.values()}) == 40
    for drawn in shapes.values():
        assert len(drawn) == 6
        for s in drawn.values():
            assert (s["input_len"] + s["output_len"]) * (1 + s["range_ratio"]) <= 1000
            assert 16 <= s["input_len"] <= 700 and 2 <= s["output_len"] <= 600 and 0.3 <= s["rate_rps"] <= 6.0
            assert s.get("prefix_len", 0) < s["input_len"]
