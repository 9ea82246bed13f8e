"""The apply journal: an open apply holds its target, steps are kept in order, outcomes are counted."""

from __future__ import annotations

import pytest

from tuner.errors import TargetBusyError
from tuner.store import journal as jr


def begin(store, target="t", now=100.0):
    return jr.begin_apply(
        store.engine,
        target=target,
        recommendation_id=7,
        kind="apply",
        mode="manual",
        now=now,
        diff={"max_num_seqs": 8},
        old_flags={"max_num_seqs": 4},
        new_flags={"max_num_seqs": 8},
        old_argv=["a"],
        new_argv=["b"],
        owner_pid=1,
        owner_start=2,
    )


def test_an_open_apply_holds_the_target_until_done(store):
    first = begin(store)
    with pytest.raises(TargetBusyError, match=f"apply #{first} in progress"):
        begin(store, now=101)
    other = begin(store, target="u")  # other targets are free
    jr.step(store.engine, first, "draining", "pid 9", now=102, state="draining")
    assert jr.open_applies_for(store.engine, "t") == [first]
    jr.finish(store.engine, first, "kept", "fine", now=103)
    assert jr.open_applies_for(store.engine, "t") == []
    again = begin(store, now=104)
    assert again > first and [a.id for a in jr.open_applies(store.engine)] == [other, again]
    a = jr.get_apply(store.engine, first)
    assert [s["step"] for s in a.steps] == ["planned", "draining", "done: kept"]
    assert a.state == "done" and a.outcome == "kept" and a.old_argv == ["a"]
    assert jr.outcome_counts(store.engine) == {("t", "kept"): 1}


def test_states_and_outcomes_are_checked(store):
    a = begin(store)
    with pytest.raises(ValueError, match="state 'half'"):
        jr.step(store.engine, a, "x", now=1, state="half")
    with pytest.raises(ValueError, match="outcome 'maybe'"):
        jr.finish(store.engine, a, "maybe", "", now=1)


def test_managed_state_round_trips(store):
    s = jr.ManagedState(
        target="t",
        pid=5,
        proc_start=6,
        argv=["x"],
        flags={"parallel": 2},
        config_flags={"parallel": 2},
        started_ms=1,
        restarts=[2, 3],
        state="running",
        updated_ms=4,
        note="",
    )
    jr.save_managed(store.engine, s)
    jr.save_managed(store.engine, s.__class__(**{**s.__dict__, "state": "stopped", "pid": None}))
    got = jr.get_managed(store.engine, "t")
    assert got.state == "stopped" and got.pid is None and got.restarts == [2, 3]


def test_each_apply_records_its_outage_and_the_next_one_is_told_the_median(store, tmp_path):
    """Drain start -> health gate passed is the time a single instance serves nothing; `apply-recommendation`
    says the median of the earlier ones before it asks (or, with --yes, before it starts)."""
    from tuner.apply.flow import Applier
    from tuner.apply.observe import outage
    from tuner.config import parse_config

    cfg = parse_config("targets:\n  - {name: t, backend: vllm, url: 'http://127.0.0.1:9'}\n")
    ap = Applier(cfg, store, tmp_path, say=lambda _m: None)
    assert ap.observer.expected_outage(cfg.targets[0]) is None  # nothing measured yet
    for i, secs in enumerate((30.0, 10.0, 20.0)):
        aid = begin(store, now=1000.0 * (i + 1))
        jr.step(store.engine, aid, "draining", "pid 9", now=1000.0 * (i + 1) + 1, state="draining")
        jr.step(store.engine, aid, "healthy", "", now=1000.0 * (i + 1) + 1 + secs)
        jr.finish(store.engine, aid, "kept", "", now=1000.0 * (i + 1) + 100)
        assert outage(jr.get_apply(store.engine, aid)) == secs
    assert ap.observer.expected_outage(cfg.targets[0]) == (20.0, 3)


def test_which_applies_leave_their_new_flags_standing(store):
    """An inconclusive verdict under on_inconclusive: keep_new keeps the new flags as surely as `kept` does: the
    flags in force and `tuner rollback` must see them (a clean-clone run found rollback refusing one)."""
    from tuner.apply.servers import flags_in_force
    from tuner.config import parse_config

    t = parse_config(
        "targets:\n  - {name: t, backend: vllm, url: 'http://127.0.0.1:9', flags: {max-num-seqs: 4}}\n"
    ).targets[0]
    outcomes = {}
    for i, (outcome, restored) in enumerate(
        [("inconclusive", False), ("inconclusive", True), ("kept", False), ("rolled_back", True), ("failed", False)]
    ):
        aid = begin(store, now=200 + 10 * i)
        if restored:
            jr.step(store.engine, aid, "restoring", "[]", now=201 + 10 * i, state="starting")
            jr.step(store.engine, aid, "restored", "previous flags, healthy", now=202 + 10 * i)
        jr.finish(store.engine, aid, outcome, "", now=203 + 10 * i)
        outcomes[(outcome, restored)] = jr.new_flags_stand(jr.get_apply(store.engine, aid))
    assert outcomes == {
        ("inconclusive", False): True,
        ("inconclusive", True): False,
        ("kept", False): True,
        ("rolled_back", True): False,
        ("failed", False): False,
    }
    # newest first: the failed and rolled-back ones changed nothing; the kept one (max_num_seqs 8) is in force
    assert flags_in_force(store.engine, t) == {"max_num_seqs": 8}
    only = begin(store, target="u", now=300)
    jr.finish(store.engine, only, "inconclusive", "kept under keep_new", now=301)
    u = parse_config(
        "targets:\n  - {name: u, backend: vllm, url: 'http://127.0.0.1:9', flags: {max-num-seqs: 4}}\n"
    ).targets[0]
    assert flags_in_force(store.engine, u) == {"max_num_seqs": 8}  # was 4 before: the inconclusive one was ignored


def test_the_one_open_apply_migration_keeps_the_oldest_holding_and_downgrades(tmp_path):
    """0008 builds the unique index over open applies' keys; a store where the old race left two open applies on
    one target upgrades all the same (the oldest holds it, the other is left for `tuner reconcile`), and the
    downgrade gives the columns back."""
    from alembic import command
    from sqlalchemy import text

    from tuner.store.db import _alembic_config, open_engine, upgrade

    engine = open_engine(f"sqlite:///{tmp_path / 'm.db'}")
    upgrade(engine, "0007")
    cols = (
        "target, kind, mode, created_ms, updated_ms, state, outcome, diff, old_flags, new_flags, old_argv, "
        "new_argv, baseline, after, note, owner_pid, owner_start"
    )
    with engine.begin() as conn:
        for target, state in (("t", "done"), ("t", "observing"), ("t", "planned"), ("u", "draining")):
            conn.execute(
                text(
                    f"INSERT INTO applies ({cols}) VALUES (:t, 'apply', 'manual', 1, 1, :s, NULL, '{{}}', "
                    "'{}', '{}', '[]', '[]', '{}', '{}', '', 1, 1)"
                ),
                {"t": target, "s": state},
            )
    upgrade(engine)
    assert [(a.id, a.holds) for a in jr.open_applies(engine)] == [(2, "target:t"), (3, "target:t#3"), (4, "target:u")]
    with pytest.raises(TargetBusyError, match="apply #2 in progress"):
        jr.begin_apply(
            engine,
            target="t",
            recommendation_id=None,
            kind="apply",
            mode="manual",
            now=1,
            diff={},
            old_flags={},
            new_flags={},
            old_argv=[],
            new_argv=[],
            owner_pid=1,
            owner_start=1,
        )
    cfg = _alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0007")
    with engine.connect() as conn:
        names = [r[1] for r in conn.execute(text("PRAGMA table_info(applies)"))]
        assert "holds" not in names and "owner_pid" not in [
            r[1] for r in conn.execute(text("PRAGMA table_info(tune_runs)"))
        ]
        assert conn.execute(text("SELECT count(*) FROM applies")).scalar() == 4


def test_a_replica_holds_its_group_and_a_claim_is_taken_once(store):
    r1 = jr.begin_apply(
        store.engine,
        target="g.r1",
        recommendation_id=None,
        kind="apply",
        mode="manual",
        now=1,
        diff={},
        old_flags={},
        new_flags={},
        old_argv=[],
        new_argv=[],
        owner_pid=1,
        owner_start=2,
        group="g",
    )
    with pytest.raises(TargetBusyError, match=f"replica group g of target 'g.r2' has apply #{r1} on g.r1 in prog"):
        jr.begin_apply(
            store.engine,
            target="g.r2",
            recommendation_id=None,
            kind="apply",
            mode="manual",
            now=2,
            diff={},
            old_flags={},
            new_flags={},
            old_argv=[],
            new_argv=[],
            owner_pid=1,
            owner_start=2,
            group="g",
        )
    assert jr.holder(store.engine, "group:g").id == r1 and jr.holder(store.engine, "target:g.r2") is None
    # two reconcilers read the same open apply; the compare-and-set on its owner lets one take it
    seen = jr.get_apply(store.engine, r1)
    assert jr.claim(store.engine, seen, (10, 11), "reconcile", "first", now=3) is True
    assert jr.claim(store.engine, seen, (20, 21), "reconcile", "second", now=3) is False
    a = jr.get_apply(store.engine, r1)
    assert (a.owner_pid, a.owner_start) == (10, 11) and [s["detail"] for s in a.steps] == ["{}", "first"]
