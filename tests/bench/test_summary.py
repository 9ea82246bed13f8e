"""bench/summary.py: bench/README.md's summary table is what the script reads from the newest files in bench/results/."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import summary  # noqa: E402

REAL = ROOT / "bench" / "results"


def _row(key: str) -> summary.Row:
    return next(r for r in summary.ROWS if r.key == key)


def test_the_readme_table_is_what_the_script_reads_from_the_results() -> None:
    readme = summary.README.read_text(encoding="utf-8")
    assert summary.splice(readme, summary.render()) == readme, (
        "bench/README.md's summary is stale: run python bench/summary.py --write"
    )
    assert summary.BEGIN in readme and summary.render().count('<a id="') == len(summary.ROWS)


def test_the_check_command_says_when_the_table_is_stale(tmp_path: Path) -> None:
    ok = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "summary.py"), "--check"], capture_output=True, text=True, cwd=tmp_path
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_a_row_reads_the_newest_file_that_measured_it(tmp_path: Path) -> None:
    """A newer whole run that skipped the scale part leaves the CPU row on the older one; the alert row moves on."""
    shutil.copy(REAL / "2026-11-25-1721-whole-run.md", tmp_path / "2026-11-25-1721-whole-run.md")
    newer = (
        (REAL / "2026-11-25-1721-whole-run.md")
        .read_text(encoding="utf-8")
        .replace("| 1000 | 0.82× |", "| 1000 | 0.71× |")
    )
    assert "0.71×" in newer
    (tmp_path / "2026-12-01-0900-whole-run.md").write_text(newer, encoding="utf-8")
    shutil.copy(REAL / "2026-11-25-1646-whole-run.md", tmp_path / "2026-12-02-0900-whole-run.md")  # alerts only
    found = summary.results(tmp_path)
    assert [r.path.name for r in found][0] == "2026-12-02-0900-whole-run.md"
    figure, src = summary.newest(_row("cpu"), found)  # type: ignore[misc]
    assert src.path.name == "2026-12-01-0900-whole-run.md" and figure.startswith("0.71× Prometheus's CPU")
    figure, src = summary.newest(_row("alert-latency"), found)  # type: ignore[misc]
    assert src.path.name == "2026-12-02-0900-whole-run.md" and "tuner 1.30 s" in figure, figure
    assert summary.newest(_row("keepalive"), found) is None


def test_every_row_finds_its_figure_in_the_results() -> None:
    found = summary.results()
    for row in summary.ROWS:
        got = summary.newest(row, found)
        assert got is not None, row.key
        figure, src = got
        assert src.kind in row.kinds and figure and "nan" not in figure, (row.key, figure)


@pytest.mark.parametrize(
    "key, expected",
    [
        ("cpu", "0.82× Prometheus's CPU per target-scrape (1,115 against 1,357 µs), 1,000 targets every 5 s"),
        ("scrapes", "12,001 / 12,001 done / scheduled (1,000 targets); lateness p99 0.025 s"),
        ("alert-latency", "tuner 1.16 s, Prometheus + Alertmanager 1.53 s (10 trials; worst trial 1.13× theirs)"),
        ("storage", "1.62 MiB per target-day"),
        ("rolling", "one llama-server 355 of 10,000; 2 replicas behind HAProxy, rolling 0 of 8,161"),
        ("tune-chat", "100% of the grid's best (random search 30%), 3/12 trials"),
        ("tune-shared-prefix", "65% of the grid's best"),
        ("spread-pooled", "all ten (55 runs): one load both met and missed within ±14% as run, ±7% at one host speed"),
        (
            "tune-corpus",
            "run off side by side (11 runs below 95%): tune's decision served more in 3, as much in 4, less in 3, "
            "no difference measurable in 1",
        ),
    ],
)
def test_rows_read_the_figures_the_results_files_hold(key: str, expected: str) -> None:
    got = summary.newest(_row(key), summary.results())
    assert got is not None and expected in got[0], got


def test_a_results_file_named_otherwise_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "RESULTS.md").write_text("## 2026-11-25 17:21 UTC\n")
    with pytest.raises(SystemExit, match=r"RESULTS\.md: name it YYYY-MM-DD-HHMM-<kind>\.md"):
        summary.results(tmp_path)


def test_results_path_names_a_run_by_its_start() -> None:
    when = datetime(2026, 11, 25, 17, 21, 40, tzinfo=timezone.utc)
    assert summary.results_path("whole-run", when).name == "2026-11-25-1721-whole-run.md"
    with pytest.raises(ValueError, match="results kind"):
        summary.results_path("Whole Run", when)


def test_splice_rewrites_only_between_the_markers() -> None:
    text = f"# Benchmarks\n\nintro\n\n{summary.BEGIN}\nold table\n{summary.END}\n\n## The scripts\n"
    out = summary.splice(text, "| new |\n")
    assert out == f"# Benchmarks\n\nintro\n\n{summary.BEGIN}\n| new |\n{summary.END}\n\n## The scripts\n"
    with pytest.raises(SystemExit, match="markers are missing"):
        summary.splice("no markers", "| new |\n")


# ---- bench/RESULTS.md: issue 40's one table ----------------------------------------------------------------------


def test_results_md_is_what_the_script_renders_from_the_results() -> None:
    assert summary.RESULTS_MD.read_text(encoding="utf-8") == summary.render_results_md(), (
        "bench/RESULTS.md is stale: run python bench/summary.py --write"
    )


def test_the_computed_tally_agrees_with_the_hand_kept_one_in_the_newest_file() -> None:
    """Each session wrote "every held-back run to date: X of N" into its file by hand; the table counts the same runs
    from every score table, each at its first score. The two counts come from different places and must agree."""
    found = summary.results()
    newest = next(r for r in found if r.kind == "tune-corpus" and "Every held-back run to date" in r.text)
    m = re.search(r"^Every held-back run to date \([^)]*\): (\d+) of (\d+) reach", newest.text, re.M)
    assert m, newest.path.name
    held = [r for r in summary.corpus_runs(found) if r.backend == "vLLM" and r.set == "held back"]
    reached = sum((r.share(r.choice) or 0.0) >= 0.95 for r in held)
    assert (reached, len(held)) == (int(m.group(1)), int(m.group(2)))


def _score_file(shape: str, choice: str, decision: str = "100%") -> str:
    return (
        "## a run\n\n| shape | set | from | grid best | tune's choice / grid best | tune's decision / grid best | "
        "tune's trials / grid's | random search's choice / grid best | crashes | the flags in force, measured again "
        "(in order) | worst repeat |\n|---|---|---|---|---:|---:|---:|---:|---:|---|---:|\n"
        f"| {shape} | held back | poor | 10 req/s (a) | {choice} (b) | {decision} (b) | 3/12 | - | 0 | 9, 10 | 5% |\n"
        f"| {shape} | held back | defaults | 10 req/s (a) | 100% (a) | 100% (a) | 4/12 | - | 1 | - | - |\n"
    )


def test_a_run_keeps_its_first_score_when_a_later_file_scores_it_again(tmp_path: Path) -> None:
    (tmp_path / "2026-12-01-0100-tune-corpus.md").write_text(_score_file("s1", "87%", "87%"), encoding="utf-8")
    (tmp_path / "2026-12-01-0300-tune-corpus.md").write_text(
        _score_file("s1", "100%") + "\n" + _score_file("s2", "90%", "100%"), encoding="utf-8"
    )
    runs = summary.corpus_runs(summary.results(tmp_path))
    assert [(r.shape, r.start, r.choice, r.source.path.name[:15]) for r in runs] == [
        ("s1", "poor", "87% (b)", "2026-12-01-0100"),
        ("s1", "defaults", "100% (a)", "2026-12-01-0100"),
        ("s2", "poor", "90% (b)", "2026-12-01-0300"),
        ("s2", "defaults", "100% (a)", "2026-12-01-0300"),
    ]
    assert summary.corpus_tally(runs) == (
        "4 runs: tune's choice reaches at least 95% of the grid's best in 2 of 4; what tune told the user to run, "
        "in 3 of 4; trials at most a quarter of the grid's in 2 of 4; crashes 2"
    )
    page = summary.render_results_md(tmp_path)
    assert (
        "## vLLM, held back" in page
        and "## vLLM, built on" not in page
        and "| s1 | poor | 10 req/s (a) | 87% (b) |" in page
    )


def test_the_check_command_says_when_results_md_is_stale(tmp_path: Path) -> None:
    """--check compares the real files; a copy of the tree with RESULTS.md edited by hand fails it, naming it."""
    tree = tmp_path / "repo"
    shutil.copytree(ROOT / "bench", tree / "bench", ignore=shutil.ignore_patterns("__pycache__", "corpus*"))
    page = tree / "bench" / "RESULTS.md"
    page.write_text(page.read_text(encoding="utf-8").replace("crashes 0", "crashes 9", 1), encoding="utf-8")
    bad = subprocess.run(
        [sys.executable, str(tree / "bench" / "summary.py"), "--check"], capture_output=True, text=True, cwd=tmp_path
    )
    assert bad.returncode == 1 and "RESULTS.md: not what bench/results/ gives" in bad.stdout, bad.stdout + bad.stderr
