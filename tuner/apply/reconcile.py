"""Crash safety: finish or roll back every apply whose tuner died, from what the journal says it was doing and
what is running now.

Every step of an apply is journaled before it is taken (tuner/store/journal.py); an entry whose owner is gone is
claimed (compare-and-set on its owner and state), the server found is matched against the entry's old and new
argv, and the apply is observed again, closed, or rolled back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tuner.apply import claims
from tuner.apply import managed as mg
from tuner.apply.port import Plan
from tuner.apply.routes import route_for
from tuner.errors import ApplyError, ServerStartError
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store.journal import ApplyOutcome, ApplyState, ApplyStep, ServerState
from tuner.store.recommendations import RecStatus

if TYPE_CHECKING:
    from tuner.apply.flow import Applier
    from tuner.config import Target

__all__ = ["reconcile"]


def reconcile(ap: Applier, *, only: Callable[[jr.StoredApply], bool] | None = None) -> list[str]:
    """Finish or roll back every apply whose tuner died (those ``only`` accepts, when given); what was done, one
    line each.

    Each is claimed first, by compare-and-set on the owner and state read (jr.claim), and within this process by
    taking its id: of two reconcilers at once (`tuner run` starting while `tuner reconcile` runs, or two auto
    steps) one restores it and the other leaves it alone."""
    done: list[str] = []
    for a in jr.open_applies(ap.engine):
        if a.state == ApplyState.AWAITING_MANUAL or (only is not None and not only(a)):
            continue
        if (a.owner_pid, a.owner_start) != ap.owner and mg.is_alive(a.owner_pid, a.owner_start):
            continue  # another live tuner is doing it
        if not claims.take(ap.engine, a.id):
            continue  # a thread of this process is doing it
        try:
            if jr.claim(
                ap.engine,
                a,
                ap.owner,
                ApplyStep.RECONCILE,
                f"tuner pid {a.owner_pid} stopped at step {a.state}",
                now=ap.clock(),
            ):
                done.append(_reconcile_one(ap, a))
            # else: another tuner claimed it first
        finally:
            claims.drop(ap.engine, a.id)
    return done


def _reconcile_one(ap: Applier, a: jr.StoredApply) -> str:
    now = ap.clock()
    if a.kind == "tune" and a.mode == "shadow":  # its trials ran beside production: nothing to put back
        jr.finish(
            ap.engine,
            a.id,
            ApplyOutcome.UNCHANGED,
            "reconciled: the tuner of this tuning run stopped; its trials ran beside production, which was not touched",
            now=now,
        )
        return _line(jr.get_apply(ap.engine, a.id))
    try:
        t = ap.cfg.target(a.target)
    except Exception:  # noqa: BLE001  (UnknownTargetError: the config no longer has it)
        jr.finish(ap.engine, a.id, ApplyOutcome.FAILED, "reconciled: the target is no longer configured", now=now)
        return f"apply #{a.id}: target {a.target} no longer configured; closed as failed"
    p = Plan(t, route_for(t), a.diff, a.old_flags, a.new_flags, a.old_argv, a.new_argv)
    try:
        p.route.settle(ap, a.id, t)
    except ApplyError as exc:
        ap.step(a.id, ApplyStep.SETTLE_FAILED, str(exc).splitlines()[0])
    found, healthy = _found(ap, t, a)
    where = f"tuner died at step {a.state}; server found with {found}" + (
        " and healthy" if healthy else "" if found == "no server running" else " but not healthy"
    )
    ap.step(a.id, ApplyStep.RECONCILE_FOUND, where)
    if a.kind == "restart" and healthy:  # old and new flags are the same: it is running again, done
        jr.finish(ap.engine, a.id, ApplyOutcome.KEPT, f"reconciled: {where}", now=ap.clock())
        return _line(jr.get_apply(ap.engine, a.id))
    if found == "the new flags" and healthy and a.kind == "apply":
        ap.say(f"apply #{a.id}: {where}: observing again")
        return _line(
            ap.observe_and_judge(a.id, p, a.recommendation_id, a.baseline, prefix="reconciled: " + where + "; ")
        )
    back = ApplyOutcome.UNCHANGED if a.kind == "tune" else ApplyOutcome.ROLLED_BACK  # a tuning run changes nothing
    if found == "the old flags" and healthy:
        jr.finish(ap.engine, a.id, back, f"reconciled: {where}; nothing was changed", now=ap.clock())
        return _line(jr.get_apply(ap.engine, a.id))
    restored = ap.restore(a.id, p)
    outcome = ApplyOutcome.FAILED if restored.failed else back
    jr.finish(ap.engine, a.id, outcome, f"reconciled: {where}; {restored}", now=ap.clock())
    if a.recommendation_id is not None and a.kind == "apply":
        recs.set_status(
            ap.engine,
            a.recommendation_id,
            RecStatus.ROLLED_BACK,
            now=ap.clock(),
            note=f"reconciled after tuner died: {where}",
        )
    return _line(jr.get_apply(ap.engine, a.id))


def _found(ap: Applier, t: Target, a: jr.StoredApply) -> tuple[str, bool]:
    """Which flags the target's server runs now (the new, the old, other, or no server; "unknown" for a server
    tuner does not manage) and whether it is healthy. A server started but not yet recorded when tuner died is
    found by its argv and recorded; one still starting gets its full start time."""
    if t.managed is None:
        return "unknown", False
    r = ap.running(t)
    if r is None:  # killed between starting a server and recording it: find it by its argv
        for candidate in (a.new_argv, a.old_argv):
            pid = mg.find_by_argv(candidate)
            if pid is not None:
                r = mg.Running(pid, mg.proc_start_time(pid) or 0, candidate, mg.log_path(t, ap.config_dir))
                ap.servers.save(t, r, a.new_flags if candidate == a.new_argv else a.old_flags, ServerState.RUNNING)
                break
    if r is None:
        return "no server running", False
    argv = mg.proc_argv(r.pid)
    found = "the new flags" if argv == a.new_argv else "the old flags" if argv == a.old_argv else "other flags"
    try:
        mg.wait_healthy(r, t.url, t.managed.start_timeout.total_seconds())
        mg.yield_engine_core(r, t.managed.engine_core_nice)  # set, not lowered again: as the start would have
        mg.health_gate(t, timeout_s=30)
    except ServerStartError:
        return found, False
    return found, True


def _line(a: jr.StoredApply) -> str:
    return f"apply #{a.id} {a.target}: {a.outcome}: {a.note}"
