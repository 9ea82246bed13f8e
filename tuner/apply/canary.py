"""A replica group's canary: part of the group takes the new flags, the rest keeps the old ones, both serve the
same live traffic, and the verdict compares the canary with the control over the same window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.apply import admit
from tuner.apply.port import Canaried, Plan
from tuner.apply.verdict import judge
from tuner.errors import ApplyError, ServerStartError
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store.journal import ApplyOutcome, ApplyStep
from tuner.store.recommendations import RecStatus

if TYPE_CHECKING:
    from tuner.apply.flow import Applier

__all__ = ["canary"]


def canary(ap: Applier, rec_id: int, *, mode: str = "manual", force: bool = False) -> jr.StoredApply:
    """A replica group's canary: part of the group takes the new flags (the recommendation's replica behind a
    balancer; a Kubernetes workload's canary Deployment), the rest keeps the old ones, both serve the same live
    traffic, and the verdict compares the canary with the control over the same window (same offered load by
    construction). Kept: the rest of the group rolls. Otherwise the canary goes back."""
    rec = admit.fresh(ap, rec_id)
    p = ap.plan(rec)
    t = p.target
    if not isinstance(p.route, Canaried):
        raise ApplyError(
            f"{t.name} is not a replica of a group behind a balancer: a canary needs peers serving "
            "the same traffic to compare with (replicas: and balancer: in its config, or "
            "kubernetes.canary and kubernetes.pods)"
        )
    route: Canaried = p.route
    if not force:
        admit.check_restart_budget(ap, t)
    aid = ap.begin(p, rec.id, "canary", mode)
    return ap.opened(aid, p, f"canary of recommendation #{rec.id}", lambda: _canary(ap, aid, p, rec, route)).run()


def _canary(ap: Applier, aid: int, p: Plan, rec: recs.StoredRecommendation, route: Canaried) -> jr.StoredApply:
    t = p.target
    try:
        (canary, canary_in), (control, control_in) = route.canary(ap, aid, p)
    except (ServerStartError, ApplyError) as exc:
        return ap.switch_failed(aid, p, rec.id, exc)
    died, v, t0, now = ap.observer.observe(
        aid,
        t,
        f"canary {canary} against control {control}, same window, ",
        lambda t0, now: judge(
            ap.observer.served(t, control_in, t0, now),
            ap.observer.served(t, canary_in, t0, now),
            min_requests=t.apply.min_requests,
        ),
    )
    # the journal's "before" is the control, its "after" the canary: the same window, side by side
    jr.set_kpis(
        ap.engine,
        aid,
        now=now,
        baseline={"replica": control, **ap.observer.kpis_of(t, control_in, t0, now)},
        after={"replica": canary, **ap.observer.kpis_of(t, canary_in, t0, now)},
    )
    if died or v is None:
        outcome, reason = ApplyOutcome.ROLLED_BACK, f"the canary died while observed: {died}"
    else:
        outcome, reason = (
            v.outcome,
            (f"canary against control over the same window: {v.reason} (confidence {v.confidence:.2f}; {v.test})"),
        )
    if v is not None and v.slo is not None:
        ap.step(aid, ApplyStep.SLO, v.slo.line())
    ap.step(aid, ApplyStep.VERDICT, f"{outcome}: {reason}")
    if outcome == ApplyOutcome.KEPT or (outcome == ApplyOutcome.INCONCLUSIVE and t.apply.on_inconclusive == "keep"):
        if outcome == ApplyOutcome.INCONCLUSIVE:
            reason += "; the new flags stay (apply.on_inconclusive: keep)"
        try:
            route.promote(ap, aid, p)
        except (ServerStartError, ApplyError) as exc:
            return ap.switch_failed(aid, p, rec.id, exc)
        jr.finish(ap.engine, aid, outcome, reason + "; rolled out to the group", now=ap.clock())
        recs.set_status(ap.engine, rec.id, "applied", now=ap.clock(), note=reason)
        admit.expire_stale(ap, t, aid)
        return jr.get_apply(ap.engine, aid)
    if outcome == ApplyOutcome.INCONCLUSIVE:
        reason += "; the previous flags are restored (apply.on_inconclusive: rollback)"
    restored = ap.restore(aid, p)
    jr.finish(ap.engine, aid, outcome, f"{reason}; {restored}; the control was never changed", now=ap.clock())
    recs.set_status(ap.engine, rec.id, RecStatus.ROLLED_BACK, now=ap.clock(), note=reason)
    return jr.get_apply(ap.engine, aid)
