"""What may start, and what an apply makes stale: a proposal applies only while it fits the flags in force, and
tuner restarts a server at most ``apply.max_restarts_per_hour`` times an hour.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.config import Target
from tuner.errors import ApplyError, NotProposedError
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store.journal import ApplyStep

if TYPE_CHECKING:
    from tuner.apply.flow import Applier

__all__ = ["check_restart_budget", "expire_stale", "fresh", "proposed", "stale"]


def proposed(engine: Any, rec_id: int) -> recs.StoredRecommendation:
    """The recommendation, if it may be applied: NotProposedError unless it is still proposed."""
    rec = recs.get_recommendation(engine, rec_id)
    if rec.status != "proposed":
        raise NotProposedError(rec_id, rec.status)
    return rec


def stale(rec: recs.StoredRecommendation, in_force: dict[str, Any]) -> str | None:
    """Why a proposal no longer fits the flags in force (None when it still does): what it would set is in force
    already (an apply rolled over the group did it), or it was proposed against values of its flags that have
    changed since. Only the flags whose value it recorded are judged."""
    if all(in_force.get(k) == v for k, v in rec.diff.items()):
        return "already in force: " + ", ".join(f"{k}={v}" for k, v in rec.diff.items())
    moved = [k for k in rec.diff if k in rec.current and rec.current[k] != in_force.get(k)]
    if moved:
        return (
            "proposed against "
            + ", ".join(f"{k}={rec.current[k]}" for k in moved)
            + "; in force now: "
            + ", ".join(f"{k}={in_force.get(k)}" for k in moved)
        )
    return None


def check_restart_budget(ap: Applier, t: Target) -> None:
    """ApplyError when the target's server was started max_restarts_per_hour times in the last hour."""
    since = (ap.clock() - 3600) * 1000
    starts = sum(
        1
        for a in jr.list_applies(ap.engine, target=t.name, limit=200)
        for s in a.steps
        if s["step"] in (ApplyStep.STARTING, ApplyStep.RESTORING) and s["ts_ms"] >= since
    )
    if starts >= t.apply.max_restarts_per_hour:
        raise ApplyError(
            f"{t.name}: {starts} server starts by applies in the last hour (apply.max_restarts_per_"
            f"hour {t.apply.max_restarts_per_hour}); wait, or pass --force"
        )


def fresh(ap: Applier, rec_id: int) -> recs.StoredRecommendation:
    """The proposal, if it may be applied and still fits the flags in force; else it is expired (with why)
    and ApplyError says so."""
    rec = proposed(ap.engine, rec_id)
    t = ap.cfg.target(rec.target)
    why = stale(rec, ap.flags_in_force(t))
    if why is not None:
        recs.set_status(ap.engine, rec.id, "expired", now=ap.clock(), note=why)
        raise ApplyError(
            f"recommendation #{rec.id} for {t.name}: {why}; it is expired (`tuner recommend "
            f"{t.name}` proposes against the flags in force)"
        )
    return rec


def expire_stale(ap: Applier, t: Target, apply_id: int) -> list[int]:
    """After an apply changed the flags of ``t`` (and of every replica of its group): the proposals for them
    that no longer fit are expired, so none is applied against flags that are gone. Returns their ids."""
    done = []
    for m in ap.cfg.group(t):
        in_force = ap.flags_in_force(m)
        for rec in recs.proposed_for(ap.engine, m.name):
            why = stale(rec, in_force)
            if why is not None:
                recs.set_status(ap.engine, rec.id, "expired", now=ap.clock(), note=f"{why} (apply #{apply_id})")
                done.append(rec.id)
    return done
