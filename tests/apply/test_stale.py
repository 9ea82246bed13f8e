"""A proposal made against flags that are gone is never applied: it is expired, with why (issue 14: after a roll
over a replica group, the other replicas' proposals went stale)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tuner.apply import admit
from tuner.apply.admit import stale
from tuner.apply.flow import Applier
from tuner.config import parse_config
from tuner.errors import ApplyError
from tuner.store import journal as jr
from tuner.store import recommendations as recs


def _rec(store, target: str, diff: dict, current: dict) -> int:
    return recs.add_recommendation(
        store.engine,
        target=target,
        now=time.time(),
        rules=["r"],
        diff_key=str(diff),
        diff=diff,
        current=current,
        evidence=[],
        expected_effect="",
        risk="",
        confidence=0.9,
        rank=1,
        memory_check={"ok": True},
    )


def test_stale_says_what_is_in_force_already_or_what_moved():
    rec = lambda diff, current: recs.StoredRecommendation(  # noqa: E731
        id=1,
        target="t",
        created_ms=0,
        updated_ms=0,
        status="proposed",
        rules=[],
        diff_key="",
        diff=diff,
        current=current,
        evidence=[],
        expected_effect="",
        risk="",
        confidence=1.0,
        rank=1,
        memory_check={},
        note="",
    )
    assert stale(rec({"max_num_seqs": 8}, {"max_num_seqs": 4}), {"max_num_seqs": 4}) is None
    assert (
        stale(rec({"max_num_seqs": 8}, {"max_num_seqs": 4}), {"max_num_seqs": 8}) == "already in force: max_num_seqs=8"
    )
    assert stale(rec({"max_num_seqs": 16}, {"max_num_seqs": 4}), {"max_num_seqs": 8}) == (
        "proposed against max_num_seqs=4; in force now: max_num_seqs=8"
    )
    assert stale(rec({"max_num_seqs": 16}, {}), {"max_num_seqs": 8}) is None  # no value recorded: not judged
    assert stale(rec({"enable_prefix_caching": True}, {"enable_prefix_caching": None}), {}) is None  # unset = unset


def test_a_roll_over_a_group_expires_the_other_replicas_proposals_and_a_stale_one_is_never_applied(tmp_path, store):
    """The group's replicas run max-num-seqs 8 now (tuner's managed state, as a roll leaves it): r2's proposal of
    4 -> 8 is in force already, r1's 4 -> 16 was made against a value that is gone; applying either is refused
    before anything runs and expires it; a proposal against the flags in force is left alone."""
    cfg = parse_config(
        "targets:\n  - name: chat\n    backend: vllm\n    url: 'http://127.0.0.1:9'\n"
        "    balancer: {socket: /nonexistent.sock, backend: chat}\n"
        "    replicas: [{name: r1, url: 'http://127.0.0.1:8001'}, {name: r2, url: 'http://127.0.0.1:8002'}]\n"
        f"    managed: {{model: '{tmp_path}', flags: {{max_num_seqs: 4}}}}\n"
    )
    now = time.time()
    for r in ("chat.r1", "chat.r2"):
        jr.save_managed(
            store.engine,
            jr.ManagedState(
                target=r,
                pid=None,
                proc_start=None,
                argv=[],
                flags={"max_num_seqs": 8},
                config_flags={"max_num_seqs": 4},
                started_ms=int(now * 1000),
                restarts=[],
                state="running",
                updated_ms=int(now * 1000),
                note="",
            ),
        )
    ap = Applier(cfg, store, Path(tmp_path), say=lambda m: None)
    in_force = _rec(store, "chat.r2", {"max_num_seqs": 8}, {"max_num_seqs": 4})
    moved = _rec(store, "chat.r1", {"max_num_seqs": 16}, {"max_num_seqs": 4})
    fits = _rec(store, "chat.r1", {"max_num_batched_tokens": 4096}, {"max_num_batched_tokens": None})
    with pytest.raises(ApplyError, match=r"#\d+ for chat.r2: already in force: max_num_seqs=8; it is expired"):
        ap.apply(in_force)
    assert recs.get_recommendation(store.engine, in_force).status == "expired"
    assert jr.list_applies(store.engine) == []  # refused before anything ran
    assert admit.expire_stale(ap, cfg.target("chat.r2"), apply_id=7) == [moved]
    note = recs.get_recommendation(store.engine, moved).note
    assert note == "proposed against max_num_seqs=4; in force now: max_num_seqs=8 (apply #7)"
    assert recs.get_recommendation(store.engine, fits).status == "proposed"
