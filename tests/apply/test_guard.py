"""Auto mode's guardrails (tuner/apply/guard.py): each one can stop an apply, and the best proposal is taken."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tuner.apply.guard import decide, in_window, parse_window, rollback_streak
from tuner.config import ApplyPolicy
from tuner.store.journal import StoredApply
from tuner.store.recommendations import StoredRecommendation

NOW = datetime(2026, 11, 21, 3, 0, tzinfo=timezone.utc).timestamp()  # a Saturday, 03:00 UTC


def rec(id_, confidence=0.9, rank=1, status="proposed", diff=None):
    return StoredRecommendation(id=id_, target="t", created_ms=0, updated_ms=0, status=status, rules=["r"],
                                diff_key="{}", diff=diff or {"max_num_seqs": 8}, current={}, evidence=[],
                                expected_effect="",
                                risk="", confidence=confidence, rank=rank, memory_check={}, note="")


def applied(id_, *, ago_s, outcome="kept", state="done", mode="auto", starts=1):
    ms = int((NOW - ago_s) * 1000)
    steps = [{"ts_ms": ms, "step": "starting", "detail": ""}] * starts
    return StoredApply(id=id_, target="t", recommendation_id=id_, kind="apply", mode=mode, created_ms=ms, updated_ms=ms,
                       state=state, outcome=outcome if state == "done" else None, diff={}, old_flags={}, new_flags={},
                       old_argv=[], new_argv=[], baseline={}, after={}, note="", owner_pid=1, owner_start=1,
                       steps=steps)


POLICY = ApplyPolicy(mode="auto", cooldown="30m", max_restarts_per_hour=2, max_consecutive_rollbacks=2,
                     min_confidence=0.8)


def test_takes_the_best_ranked_confident_proposal():
    d = decide(now=NOW, policy=POLICY, history=[], proposals=[rec(1, 0.95, rank=2), rec(2, 0.85, rank=1),
                                                              rec(3, 0.5, rank=1)])
    assert d.go and d.recommendation.id == 2


def test_a_backend_change_is_never_taken():
    """backend_choice proposes a migration (confidence 0.5) that the applier refuses: with a low bar, auto mode
    must take the flag change ranked behind it, or nothing, never the migration."""
    low = ApplyPolicy(mode="auto", cooldown="30m", max_restarts_per_hour=2, max_consecutive_rollbacks=2,
                      min_confidence=0.5)
    migration = rec(1, 0.5, rank=1, diff={"backend": "llamacpp"})
    d = decide(now=NOW, policy=low, history=[], proposals=[migration, rec(2, 0.6, rank=2)])
    assert d.go and d.recommendation.id == 2
    d = decide(now=NOW, policy=low, history=[], proposals=[migration])
    assert not d.go and "no flag change reaches" in d.reason


@pytest.mark.parametrize("history, proposals, kwargs, reason", [
    ([], [rec(1, 0.5)], {}, "no flag change reaches confidence 0.8"),
    ([], [], {}, "nothing proposed"),
    ([applied(9, ago_s=10, state="observing")], [rec(1)], {}, "apply #9 is in progress"),
    ([], [rec(1)], {"gpus": [0, 1], "busy_gpus": [1]}, "another server on GPU 1"),
    ([applied(9, ago_s=600)], [rec(1)], {}, "cooldown: 1200s left"),
    ([applied(9, ago_s=3000, outcome="rolled_back", starts=2)], [rec(1)], {}, "2 server starts in the last hour"),
    ([applied(9, ago_s=4000, outcome="rolled_back"), applied(8, ago_s=8000, outcome="failed")], [rec(1)], {},
     "auto mode halted: the last 2 auto applies"),
])
def test_each_guardrail_stops_it(history, proposals, kwargs, reason):
    d = decide(now=NOW, policy=POLICY, history=history, proposals=proposals, **kwargs)
    assert not d.go and reason in d.reason


def test_a_kept_apply_or_a_day_ends_the_rollback_streak():
    assert rollback_streak([applied(3, ago_s=10, outcome="rolled_back"), applied(2, ago_s=20),
                            applied(1, ago_s=30, outcome="rolled_back")], NOW) == 1
    assert rollback_streak([applied(2, ago_s=90000, outcome="rolled_back"),
                            applied(1, ago_s=90001, outcome="rolled_back")], NOW) == 0
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
