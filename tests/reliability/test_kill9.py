"""kill -9 a real `tuner run` 20 times during ingest (bench/reliability.py runs 100 and records the numbers)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.reliability import run  # noqa: E402


def test_kill9_during_ingest_loses_nothing(tmp_path):
    r = run(20, seed=7, work=tmp_path, log=lambda m: None)
    assert r["kills_survived"] == 20 and r["integrity_failures"] == 0, r
    assert r["samples_seen"] > 1000 and r["samples_lost_total"] == 0, r  # the reader saw real ingest
    assert r["firings"] >= 3 and r["alert_transitions"] >= 6, r  # both rules fired; the flapping one resolved
    assert r["duplicate_transitions"] == 0 and r["missing_transitions"] == 0, r
    assert r["firings_not_notified"] == 0 and r["firings_notified_twice"] == 0, r
