"""An apply to a server tuner neither manages nor reaches by a hook: a person restarts it, then tells tuner.

``await_manual`` journals what to run and the baseline, and leaves the entry waiting; ``manual_done`` (`tuner
apply-recommendation ID --applied`, or ``--cancel``) health-checks the server and observes it like any apply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.apply import claims
from tuner.apply import managed as mg
from tuner.apply.port import Plan
from tuner.apply.routes import ROUTES, flags_argv
from tuner.errors import ApplyError, ServerStartError
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store.journal import ApplyOutcome, ApplyState, ApplyStep
from tuner.store.recommendations import RecStatus

if TYPE_CHECKING:
    from tuner.apply.flow import Applier

__all__ = ["await_manual", "manual_done"]


def await_manual(ap: Applier, aid: int, p: Plan, rec_id: int) -> jr.StoredApply:
    t = p.target
    text = (
        f"tuner does not manage {t.name} and it has no apply hook: restart it by hand with "
        f"{' '.join(flags_argv(t.backend, p.diff))} (all tunable flags: {' '.join(p.new_argv)}); then run "
        f"`tuner apply-recommendation {rec_id} --applied` and tuner health-checks and observes it "
        f"(or --cancel)"
    )
    ap.step(aid, ApplyStep.AWAITING_MANUAL, text, state=ApplyState.AWAITING_MANUAL)
    now = ap.clock()
    base = ap.observer.kpis(t, now - t.apply.baseline.total_seconds(), now)
    jr.set_kpis(ap.engine, aid, now=now, baseline=base)
    return jr.get_apply(ap.engine, aid)


def manual_done(ap: Applier, rec_id: int, *, cancel: bool = False) -> jr.StoredApply:
    a = next(
        (
            a
            for a in jr.open_applies(ap.engine)
            if a.recommendation_id == rec_id and a.state == ApplyState.AWAITING_MANUAL
        ),
        None,
    )
    if a is None:
        raise ApplyError(f"recommendation #{rec_id} has no apply waiting for a restart by hand")
    t = ap.cfg.target(a.target)
    p = Plan(t, ROUTES["manual"], a.diff, a.old_flags, a.new_flags, a.old_argv, a.new_argv)
    if cancel:
        jr.finish(ap.engine, a.id, ApplyOutcome.FAILED, "cancelled before it was applied", now=ap.clock())
        return jr.get_apply(ap.engine, a.id)
    if not claims.take(ap.engine, a.id):
        raise ApplyError(f"apply #{a.id} is being finished already (a second --applied)")
    try:
        if not jr.claim(
            ap.engine, a, ap.owner, ApplyStep.APPLIED_BY_HAND, "", now=ap.clock(), state=ApplyState.HEALTH_CHECK
        ):
            raise ApplyError(
                f"apply #{a.id} was taken over meanwhile (a second --applied or --cancel); see "
                f"`tuner journal {a.target}`"
            )
        try:
            ap.step(a.id, ApplyStep.HEALTHY, mg.health_gate(t))
        except ServerStartError as exc:
            jr.finish(
                ap.engine,
                a.id,
                ApplyOutcome.FAILED,
                f"the server does not pass the health gate: {exc}; restart it "
                f"by hand with {' '.join(flags_argv(t.backend, a.old_flags))}",
                now=ap.clock(),
            )
            recs.set_status(ap.engine, rec_id, RecStatus.FAILED, now=ap.clock(), note=str(exc))
            return jr.get_apply(ap.engine, a.id)
        return ap.observe_and_judge(a.id, p, rec_id, a.baseline)
    finally:
        claims.drop(ap.engine, a.id)
