"""Shared test setup. Real parts first: a real SQLite file per test, real local HTTP servers (tests/helpers.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def require_tool(name: str) -> str:
    """Path of a real tool; skip where it is missing, fail in CI (TUNER_REQUIRE_REAL_SERVERS=1)."""
    path = shutil.which(name)
    if path:
        return path
    msg = f"{name} not installed; run scripts/install-prometheus.sh"
    if os.environ.get("TUNER_REQUIRE_REAL_SERVERS") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture
def store(tmp_path):
    """A migrated SQLite store in a temp dir."""
    from tuner.store.db import open_engine, upgrade
    from tuner.store.store import Store

    engine = open_engine(f"sqlite:///{tmp_path / 'tuner.db'}")
    upgrade(engine)
    yield Store(engine)
    engine.dispose()
