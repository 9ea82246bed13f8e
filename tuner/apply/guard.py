"""Auto mode's guardrails, pure: given the journal and the proposals, may tuner apply one now, and which?

A target in auto mode gets a recommendation applied only when all hold:
  * no apply is open on it, nor on another target that shares one of its GPUs;
  * it is inside a maintenance window (when any are configured);
  * the cooldown since its last finished apply has passed;
  * fewer than ``max_restarts_per_hour`` server starts in the last hour (rollbacks count: they start it again);
  * fewer than ``max_consecutive_rollbacks`` auto applies in a row rolled back or failed in the last 24 hours
    (then auto mode halts for the target, and tuner raises the AutoApplyHalted alert);
  * some proposal reaches ``min_confidence``: the best rank, then the highest confidence, is taken.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable, Sequence

from tuner.store.journal import StoredApply
from tuner.store.recommendations import StoredRecommendation

__all__ = ["Window", "parse_window", "in_window", "Decision", "decide", "rollback_streak", "HALT_PERIOD_S"]

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_WINDOW = re.compile(r"^\s*(daily|[A-Za-z]{3}(?:-[A-Za-z]{3})?(?:,[A-Za-z]{3}(?:-[A-Za-z]{3})?)*)\s+"
                     r"(\d{2}):(\d{2})-(\d{2}):(\d{2})\s*$")
HALT_PERIOD_S = 24 * 3600


@dataclass(frozen=True)
class Window:
    """Days (0 = Monday) on which the window opens, and its minutes of the day, UTC; end < start wraps midnight."""

    days: frozenset[int]
    start_min: int
    end_min: int


def parse_window(text: str) -> Window:
    """``daily 02:00-04:00``, ``Mon-Fri 22:00-02:00``, ``Sat,Sun 00:00-06:00`` (UTC); ValueError names the text."""
    m = _WINDOW.match(text)
    if not m:
        raise ValueError(f"maintenance window {text!r}: expected e.g. 'daily 02:00-04:00' or 'Mon-Fri 22:00-02:00' "
                         "(UTC)")
    spec, h1, m1, h2, m2 = m.groups()
    if int(h1) > 23 or int(h2) > 23 or int(m1) > 59 or int(m2) > 59:
        raise ValueError(f"maintenance window {text!r}: times must be 00:00..23:59")
    days: set[int] = set()
    if spec.lower() == "daily":
        days = set(range(7))
    else:
        for part in spec.lower().split(","):
            first, _, last = part.partition("-")
            if first not in _DAYS or (last and last not in _DAYS):
                raise ValueError(f"maintenance window {text!r}: unknown day in {part!r} (use Mon..Sun)")
            a, b = _DAYS.index(first), _DAYS.index(last or first)
            days.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    start, end = int(h1) * 60 + int(m1), int(h2) * 60 + int(m2)
    if start == end:
        raise ValueError(f"maintenance window {text!r}: start and end are equal")
    return Window(frozenset(days), start, end)


def in_window(w: Window, ts: float) -> bool:
    t = datetime.fromtimestamp(ts, timezone.utc)
    minute, day = t.hour * 60 + t.minute, t.weekday()
    if w.start_min < w.end_min:
        return day in w.days and w.start_min <= minute < w.end_min
    # wraps midnight: opens on a listed day, closes the next morning
    return (day in w.days and minute >= w.start_min) or ((day - 1) % 7 in w.days and minute < w.end_min)


@dataclass(frozen=True)
class Decision:
    go: bool
    reason: str
    recommendation: StoredRecommendation | None = None
    halted: bool = False  # auto mode stopped by the rollback streak


def rollback_streak(history: Sequence[StoredApply], now: float) -> int:
    """Auto applies in a row (newest first) that rolled back or failed within HALT_PERIOD_S; a kept apply ends it."""
    n = 0
    for a in history:  # newest first
        if a.state != "done" or a.kind != "apply":
            continue
        if a.outcome == "kept" or a.updated_ms < (now - HALT_PERIOD_S) * 1000:
            break
        if a.mode == "auto":
            n += 1
    return n


def _starts(history: Iterable[StoredApply], since_ms: float) -> int:
    return sum(1 for a in history for s in a.steps if s["step"] in ("starting", "restoring") and s["ts_ms"] >= since_ms)


def decide(*, now: float, policy: object, history: Sequence[StoredApply], proposals: Sequence[StoredRecommendation],
           gpus: Iterable[int] = (), busy_gpus: Iterable[int] = ()) -> Decision:
    """history: this target's applies, newest first. busy_gpus: GPUs of other targets with an open apply."""
    open_now = [a for a in history if a.state != "done"]
    if open_now:
        return Decision(False, f"apply #{open_now[0].id} is in progress")
    shared = sorted(set(gpus) & set(busy_gpus))
    if shared:
        return Decision(False, f"another server on GPU {','.join(map(str, shared))} is being applied")
    streak = rollback_streak(history, now)
    limit = policy.max_consecutive_rollbacks  # type: ignore[attr-defined]
    if streak >= limit:
        return Decision(False, f"auto mode halted: the last {streak} auto applies rolled back or failed (limit "
                               f"{limit}); apply one by hand, or it resumes 24 h after the last", halted=True)
    windows = [parse_window(w) for w in policy.maintenance_windows]  # type: ignore[attr-defined]
    if windows and not any(in_window(w, now) for w in windows):
        return Decision(False, "outside the maintenance windows")
    done = [a for a in history if a.state == "done"]
    cooldown_s = policy.cooldown.total_seconds()  # type: ignore[attr-defined]
    if done and now * 1000 - done[0].updated_ms < cooldown_s * 1000:
        left = cooldown_s - (now * 1000 - done[0].updated_ms) / 1000
        return Decision(False, f"cooldown: {left:.0f}s left after apply #{done[0].id}")
    starts = _starts(history, (now - 3600) * 1000)
    if starts >= policy.max_restarts_per_hour:  # type: ignore[attr-defined]
        return Decision(False, f"{starts} server starts in the last hour (max_restarts_per_hour "
                               f"{policy.max_restarts_per_hour})")  # type: ignore[attr-defined]
    bar = policy.min_confidence  # type: ignore[attr-defined]
    # a backend change is a migration to another server, never applied (Applier.plan refuses it): were it taken
    # here, every auto tick would pick it and fail again instead of the flag changes behind it
    good = [r for r in proposals if r.status == "proposed" and r.confidence >= bar and "backend" not in r.diff]
    if not good:
        return Decision(False, f"no flag change reaches confidence {bar:g}" if proposals else "nothing proposed")
    best = min(good, key=lambda r: (r.rank, -r.confidence, r.id))
    return Decision(True, f"#{best.id} (rank {best.rank}, confidence {best.confidence:.2f})", best)
