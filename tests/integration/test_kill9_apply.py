"""kill -9 the tuner doing an apply on a real managed llama-server, 12 times at random moments, and reconcile after
each (bench/reliability.py --surface apply runs 100 and records the numbers)."""

from __future__ import annotations

import sys
from pathlib import Path

import realservers
from conftest import require

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.reliability import run  # noqa: E402


def test_kill9_during_apply_is_always_reconciled(tmp_path):
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF)
    r = run(12, seed=5, surface="apply", work=tmp_path, log=lambda m: None)
    assert r["kills_survived"] == 12 and r["integrity_failures"] == 0 and r["inconsistent"] == 0, r
    assert r["orphans"] == 0, r
    assert r["killed_mid_apply"] >= 6, r  # most kills really landed inside an apply ...
    assert r["reconciled"] == r["killed_mid_apply"], r  # ... and each of those was reconciled
    assert len(r["killed_at_step"]) >= 2, r  # at more than one step
