"""Auto mode's guardrails (tuner/apply/guard.py): each one can stop an apply, and the best proposal is taken."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tuner.apply.guard import applies_last_hour, decide, flag_flips, in_window, parse_window, rollback_streak
from tuner.config import ApplyPolicy
from tuner.store.journal import StoredApply
from tuner.store.recommendations import StoredRecommendation

NOW = datetime(2026, 11, 21, 3, 0, tzinfo=timezone.utc).timestamp()  # a Saturday, 03:00 UTC


def rec(id_, confidence=0.9, rank=1, status="proposed", diff=None):
    return StoredRecommendation(
        id=id_,
        target="t",
        created_ms=0,
        updated_ms=0,
        status=status,
        rules=["r"],
        diff_key="{}",
        diff=diff or {"max_num_seqs": 8},
        current={},
        evidence=[],
        expected_effect="",
        risk="",
        confidence=confidence,
        rank=rank,
        memory_check={},
        note="",
    )


def applied(id_, *, ago_s, outcome="kept", state="done", mode="auto", starts=1):
    ms = int((NOW - ago_s) * 1000)
    steps = [{"ts_ms": ms, "step": "starting", "detail": ""}] * starts
    return StoredApply(
        id=id_,
        target="t",
        recommendation_id=id_,
        kind="apply",
        mode=mode,
        created_ms=ms,
        updated_ms=ms,
        state=state,
        outcome=outcome if state == "done" else None,
        diff={},
        old_flags={},
        new_flags={},
        old_argv=[],
        new_argv=[],
        baseline={},
        after={},
        note="",
        owner_pid=1,
        owner_start=1,
        steps=steps,
    )


POLICY = ApplyPolicy(
    mode="auto", cooldown="30m", max_restarts_per_hour=2, max_consecutive_rollbacks=2, min_confidence=0.8
)


def test_takes_the_best_ranked_confident_proposal():
    d = decide(
        now=NOW, policy=POLICY, history=[], proposals=[rec(1, 0.95, rank=2), rec(2, 0.85, rank=1), rec(3, 0.5, rank=1)]
    )
    assert d.go and d.recommendation.id == 2


def test_a_backend_change_is_never_taken():
    """backend_choice proposes a migration (confidence 0.5) that the applier refuses: with a low bar, auto mode
    must take the flag change ranked behind it, or nothing, never the migration."""
    low = ApplyPolicy(
        mode="auto", cooldown="30m", max_restarts_per_hour=2, max_consecutive_rollbacks=2, min_confidence=0.5
    )
    migration = rec(1, 0.5, rank=1, diff={"backend": "llamacpp"})
    d = decide(now=NOW, policy=low, history=[], proposals=[migration, rec(2, 0.6, rank=2)])
    assert d.go and d.recommendation.id == 2
    d = decide(now=NOW, policy=low, history=[], proposals=[migration])
    assert not d.go and "no flag change reaches" in d.reason


@pytest.mark.parametrize(
    "history, proposals, kwargs, reason",
    [
        ([], [rec(1, 0.5)], {}, "no flag change reaches confidence 0.8"),
        ([], [], {}, "nothing proposed"),
        ([applied(9, ago_s=10, state="observing")], [rec(1)], {}, "apply #9 is in progress"),
        ([], [rec(1)], {"gpus": [0, 1], "busy_gpus": [1]}, "another server on GPU 1"),
        ([applied(9, ago_s=600)], [rec(1)], {}, "cooldown: 1200s left"),
        ([applied(9, ago_s=3000, outcome="rolled_back", starts=2)], [rec(1)], {}, "2 server starts in the last hour"),
        (
            [applied(9, ago_s=4000, outcome="rolled_back"), applied(8, ago_s=8000, outcome="failed")],
            [rec(1)],
            {},
            "auto mode halted: the last 2 auto applies",
        ),
    ],
)
def test_each_guardrail_stops_it(history, proposals, kwargs, reason):
    d = decide(now=NOW, policy=POLICY, history=history, proposals=proposals, **kwargs)
    assert not d.go and reason in d.reason


def test_a_kept_apply_or_a_day_ends_the_rollback_streak():
    assert (
        rollback_streak(
            [
                applied(3, ago_s=10, outcome="rolled_back"),
                applied(2, ago_s=20),
                applied(1, ago_s=30, outcome="rolled_back"),
            ],
            NOW,
        )
        == 1
    )
    assert (
        rollback_streak(
            [applied(2, ago_s=90000, outcome="rolled_back"), applied(1, ago_s=90001, outcome="rolled_back")], NOW
        )
        == 0
    )
    assert rollback_streak([applied(2, ago_s=10, outcome="rolled_back", mode="manual")], NOW) == 0


def test_maintenance_windows():
    policy = POLICY.model_copy(update={"maintenance_windows": ["Mon-Fri 02:00-04:00"]})
    assert "outside the maintenance windows" in decide(now=NOW, policy=policy, history=[], proposals=[rec(1)]).reason
    policy = POLICY.model_copy(update={"maintenance_windows": ["Fri 22:00-04:00"]})  # wraps into Saturday
    assert decide(now=NOW, policy=policy, history=[], proposals=[rec(1)]).go
    w = parse_window("Sat,Sun 00:00-06:00")
    assert in_window(w, NOW) and not in_window(w, NOW + 4 * 3600)
    assert in_window(parse_window("daily 02:30-03:30"), NOW)


def test_time_left_in_the_open_windows():
    from datetime import datetime, timezone

    from tuner.config import window_left

    at = datetime(2026, 11, 23, 3, 0, 30, tzinfo=timezone.utc).timestamp()  # a Monday, 03:00:30 UTC
    assert window_left([parse_window("daily 02:00-04:00")], at) == 3600 - 30
    assert window_left([parse_window("daily 04:00-05:00")], at) == 0.0  # none open
    # chained windows count as one; one that wraps midnight closes the next morning
    assert window_left([parse_window("daily 02:00-04:00"), parse_window("Mon 04:00-05:00")], at) == 2 * 3600 - 30
    assert window_left([parse_window("Sun 22:00-04:00")], at) == 3600 - 30
    assert window_left([parse_window("Sat 22:00-04:00")], at) == 0.0  # Saturday's closed on Sunday morning


@pytest.mark.parametrize("text", ["noon", "daily 25:00-26:00", "Funday 01:00-02:00", "daily 02:00-02:00"])
def test_bad_windows_are_named(text):
    with pytest.raises(ValueError, match="maintenance window"):
        parse_window(text)


def _rolled_back(id_, *, new_flags, offered, ago_s=7200, outcome="rolled_back"):
    a = applied(id_, ago_s=ago_s, outcome=outcome, starts=0)
    import dataclasses

    return dataclasses.replace(a, new_flags=new_flags, baseline={"offered_rps": offered} if offered else {})


def test_a_rolled_back_flag_set_is_not_proposed_again_until_the_load_changes():
    """Apply #5 set max_num_seqs 8 and was rolled back, judged under 3.4 req/s. The same change proposed again is
    skipped while the load stays within LOAD_MATCH of 3.4, taken once it moved beyond, and a different change is
    taken at once. The memory is of the resulting flag set, not of the recommendation's id."""
    history = [_rolled_back(5, new_flags={"max_num_seqs": 8, "max_model_len": 1024}, offered=3.4)]
    flags = {"max_num_seqs": 16, "max_model_len": 1024}
    same = rec(11, diff={"max_num_seqs": 8})
    for load in (3.4, 3.0, 4.2):  # within 1.25x of 3.4
        d = decide(now=NOW, policy=POLICY, history=history, proposals=[same], flags_now=flags, load_now=load)
        assert not d.go and "apply #5 rolled back" in d.reason and "#11" in d.reason, (load, d)
    for load in (2.5, 4.5):  # beyond it: the verdict was judged under another load
        d = decide(now=NOW, policy=POLICY, history=history, proposals=[same], flags_now=flags, load_now=load)
        assert d.go and d.recommendation.id == 11, (load, d)
    other = rec(12, rank=2, diff={"max_num_seqs": 4})
    d = decide(now=NOW, policy=POLICY, history=history, proposals=[same, other], flags_now=flags, load_now=3.4)
    assert d.go and d.recommendation.id == 12
    # the load unknown now (no scrape) or then: counted as the same load, so not proposed again
    assert not decide(now=NOW, policy=POLICY, history=history, proposals=[same], flags_now=flags, load_now=None).go
    unknown = [_rolled_back(5, new_flags={"max_num_seqs": 8, "max_model_len": 1024}, offered=None)]
    assert not decide(now=NOW, policy=POLICY, history=unknown, proposals=[same], flags_now=flags, load_now=9.0).go
    # a kept apply of those flags is no reason to skip them
    kept = [_rolled_back(5, new_flags={"max_num_seqs": 8, "max_model_len": 1024}, offered=3.4, outcome="kept")]
    assert decide(now=NOW, policy=POLICY, history=kept, proposals=[same], flags_now=flags, load_now=3.4).go


# ---- tuner's own loop: applies on one target thrashing ---------------------------------------------------------


def _change(id_, *, ago_s, old, new, kind="apply", outcome="kept", restored=False):
    ms = int((NOW - ago_s) * 1000)
    steps = [{"ts_ms": ms, "step": "restoring", "detail": ""}] if restored else []
    return StoredApply(
        id=id_,
        target="t",
        recommendation_id=None,
        kind=kind,
        mode="auto",
        created_ms=ms,
        updated_ms=ms,
        state="done",
        outcome=outcome,
        diff={},
        old_flags=old,
        new_flags=new,
        old_argv=[],
        new_argv=[],
        baseline={},
        after={},
        note="",
        owner_pid=1,
        owner_start=1,
        steps=steps,
    )


def test_applies_last_hour_counts_every_kind_begun_in_the_hour():
    history = [
        _change(4, ago_s=60, old={}, new={}, kind="restart"),
        _change(3, ago_s=600, old={}, new={}),
        _change(2, ago_s=3000, old={}, new={}, kind="rollback"),
        _change(1, ago_s=3700, old={}, new={}),
    ]
    assert applies_last_hour(history, NOW) == 3


def test_a_flag_set_back_and_forth_flips_and_a_rolled_back_apply_does_not():
    a, b = {"max_num_seqs": 8}, {"max_num_seqs": 16}
    there_and_back = [_change(2, ago_s=600, old=b, new=a), _change(1, ago_s=1200, old=a, new=b)]  # newest first
    assert flag_flips(there_and_back, NOW) == 1  # 8 -> 16 -> 8
    again = [_change(3, ago_s=60, old=a, new=b), *there_and_back]
    assert flag_flips(again, NOW) == 2  # ... -> 16
    # an apply the verdict rolled back left its old flags in force: no change, no flip
    undone = [_change(3, ago_s=60, old=a, new=b, outcome="rolled_back", restored=True), *there_and_back]
    assert flag_flips(undone, NOW) == 1
    # a rollback puts back what it restores; a restart changes nothing
    rolled = [
        _change(4, ago_s=30, old=b, new=b, kind="restart"),
        _change(3, ago_s=60, old=a, new=b, kind="rollback", outcome="rolled_back"),
        *there_and_back,
    ]
    assert flag_flips(rolled, NOW) == 2
    assert flag_flips(again, NOW, period_s=900) == 1  # only what finished within the period
