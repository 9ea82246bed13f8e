"""The layering in pyproject.toml ([tool.importlinter]) holds for tuner/, and a violation fails the check.

The README's test command runs `lint-imports` before pytest; this shows the contracts are not vacuous: each
one, broken on a copy of the tree, makes lint-imports exit non-zero and name the contract.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    if not LINT.exists():
        pytest.fail(f"{LINT} missing: pip install -e '.[test]' (import-linter)")
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "tuner", tmp_path / "tuner", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_its_contracts(tmp_path):
    proc = _lint(_copy(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize(
    "module, line, contract",
    [
        # a core package reaching up to a face: the cycle cli -> daemon -> advise/cli -> cli that started this
        ("store/window.py", "from tuner.cli import main", "The tree reads as the data flow"),
        # a function-level import counts like any other
        ("signals/derive.py", "def _sneak():\n    from tuner.app import session\n", "The tree reads as the data flow"),
        ("app/session.py", "import argparse", "Only the CLI parses a command line"),
        ("rules/evaluate.py", "import sqlalchemy", "The deciders are pure"),
    ],
)
def test_a_violation_fails_the_check_and_names_the_contract(tmp_path, module, line, contract):
    root = _copy(tmp_path)
    path = root / "tuner" / module
    path.write_text(path.read_text() + "\n" + line + "\n")
    proc = _lint(root)
    assert proc.returncode != 0, proc.stdout[-3000:]
    broken = proc.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, proc.stdout[-3000:]
