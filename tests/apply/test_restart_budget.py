"""Applies are rate-limited per target: apply.max_restarts_per_hour server starts (restores included)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tuner.apply.flow import Applier
from tuner.config import parse_config
from tuner.errors import ApplyError
from tuner.store import journal as jr
from tuner.store import recommendations as recs


def test_the_restart_budget_holds_until_forced(store, tmp_path):
    marker = tmp_path / "hook-ran"
    cfg = parse_config(
        "targets:\n  - name: t\n    backend: vllm\n    url: http://127.0.0.1:9\n"
        f"    apply: {{max_restarts_per_hour: 2, hook: {{command: [/usr/bin/touch, '{marker}']}}}}\n"
    )
    ap = Applier(cfg, store, Path(tmp_path), say=lambda m: None)
    now = time.time()
    for i, steps in enumerate((["starting"], ["starting", "restoring"])):
        aid = jr.begin_apply(
            store.engine,
            target="t",
            recommendation_id=None,
            kind="apply",
            mode="manual",
            now=now - 600 + i,
            diff={},
            old_flags={},
            new_flags={},
            old_argv=[],
            new_argv=[],
            owner_pid=1,
            owner_start=1,
        )
        for s in steps:
            jr.step(store.engine, aid, s, now=now - 600 + i)
        jr.finish(store.engine, aid, "rolled_back", "", now=now - 600 + i)
    rid = recs.add_recommendation(
        store.engine,
        target="t",
        now=now,
        rules=["r"],
        diff_key="{}",
        diff={"max_num_seqs": 8},
        current={},
        evidence=[],
        expected_effect="",
        risk="",
        confidence=0.9,
        rank=1,
        memory_check={"ok": True},
    )
    with pytest.raises(ApplyError, match=r"3 server starts by applies in the last hour .*2\); wait, or pass --force"):
        ap.apply(rid)
    assert not marker.exists() and len(jr.list_applies(store.engine)) == 2  # refused before anything ran
    with pytest.raises(ApplyError, match="server starts"):
        ap.rollback("t")
    # --force skips the budget: the rollback then stops at its own check (nothing kept to roll back)
    with pytest.raises(ApplyError, match="no kept apply to roll back"):
        ap.rollback("t", force=True)
