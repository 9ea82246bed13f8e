"""bench/summary.py: bench/README.md's summary table is what the script reads from the newest files in bench/results/."""

from __future__ import annotations

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
