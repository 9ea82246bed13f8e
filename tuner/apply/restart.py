"""Restarting a managed server with the flags it runs with, journaled like an apply (a stalled engine)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.apply import admit
from tuner.apply.port import Plan
from tuner.apply.routes import ROUTES
from tuner.errors import ApplyError, ServerStartError
from tuner.store import journal as jr
from tuner.store.journal import ApplyOutcome, ApplyStep

if TYPE_CHECKING:
    from tuner.apply.flow import Applier

__all__ = ["restart"]


def restart(ap: Applier, target: str, *, reason: str, mode: str = "auto", force: bool = False) -> jr.StoredApply:
    """Restart a managed server with the flags it runs with, journaled as a ``restart``: for a server whose process
    lives on but does not serve (a stalled engine), which the supervisor leaves alone. The guardrails of an apply
    hold: the restart budget (apply.max_restarts_per_hour; ApplyError unless ``force``), and one change at a time
    on the target and its group (the journal's lock). The server alone, not its group; no verdict (nothing
    changed to judge). Outcome kept (up and through the health gate again) or failed."""
    t = ap.cfg.target(target)
    if t.managed is None:
        raise ApplyError(f"target {t.name!r} is not managed (no managed: section); tuner cannot restart it")
    if not force:
        admit.check_restart_budget(ap, t)
    flags = ap.flags_in_force(t)
    route = ROUTES["managed"]
    argv = route.argv(t, flags, {})
    p = Plan(t, route, {}, flags, flags, argv, argv)
    aid = ap.begin(p, None, "restart", mode)
    ap.step(aid, ApplyStep.REASON, reason)
    try:
        route.switch(ap, aid, p, flags, {})
    except (ServerStartError, ApplyError) as exc:
        line = route.why_failed(ap, t, exc)
        ap.step(aid, ApplyStep.START_FAILED, line)
        jr.finish(
            ap.engine,
            aid,
            ApplyOutcome.FAILED,
            f"restarted ({reason}), but it did not come back: {line}; the "
            "supervisor starts it again (managed.max_restarts)",
            now=ap.clock(),
        )
        return jr.get_apply(ap.engine, aid)
    jr.finish(ap.engine, aid, ApplyOutcome.KEPT, f"restarted with the same flags: {reason}", now=ap.clock())
    return jr.get_apply(ap.engine, aid)
