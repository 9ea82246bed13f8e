"""A managed server whose engine stalls is restarted once it has been stalled ``managed.restart_when_stalled``
(off unless set): one step for one target, which the daemon's supervisor job runs every few seconds. The restart
is the Applier's (journaled as a ``restart``, under the apply guardrails); what counts as stalled is the same
signal the EngineStalled rules read (signals/derive.py stall_reason)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.apply.flow import Applier
from tuner.apply.restart import restart
from tuner.config import Target
from tuner.signals.derive import TargetSignals, stall_reason
from tuner.store import journal as jr

__all__ = ["STALL_WINDOW_S", "StallWatch", "stall_step"]

STALL_WINDOW_S = 60.0  # no progress over this long (the default pack's EngineStalled window)


@dataclass
class StallWatch:
    since: dict[str, float] = field(default_factory=dict)  # target -> when its engine was first seen stalled


def stall_step(
    applier: Applier, target: Target, signals: TargetSignals | None, *, now: float, watch: StallWatch
) -> jr.StoredApply | None:
    """Restart the target's server if its engine has been stalled for restart_when_stalled: the restart done, or
    None. ApplyError when the guardrails refuse it (the restart budget, an apply open on the target or its group);
    a refused or failed restart is tried again only after another restart_when_stalled of stall."""
    after = target.managed.restart_when_stalled if target.managed is not None else None
    if after is None:
        return None
    why = stall_reason(signals) if signals is not None else None
    if why is None:
        watch.since.pop(target.name, None)
        return None
    since = watch.since.setdefault(target.name, now)
    if now - since < after.total_seconds():
        return None
    watch.since[target.name] = now
    return restart(
        applier,
        target.name,
        reason=f"stalled for {now - since:.0f}s (managed.restart_when_stalled {after.total_seconds():g}s): {why}",
        mode="auto",
    )
