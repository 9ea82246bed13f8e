"""Apply, roll back, finish by hand, reconcile, read the journal: the apply use cases behind the CLI and the API.

The flow itself (drain, start, health gate, observe, verdict) is tuner/apply/flow.py; this decides what may start
and says what an outcome means to the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from tuner.app.session import Session
from tuner.apply import admit
from tuner.apply.balancer import haproxy_config
from tuner.apply.flow import Applier, Opened, Plan
from tuner.config import Config, Target
from tuner.errors import ApplyError, ConfigError
from tuner.flags import redact_argv
from tuner.store import journal as jr
from tuner.store.journal import ApplyOutcome, ApplyState, ApplyStep

__all__ = [
    "haproxy_config_for",
    "PendingApply",
    "plan",
    "apply",
    "applied_by_hand",
    "rollback",
    "reconcile",
    "journal",
    "shown",
    "held",
    "start",
    "managed_targets",
    "waiting_on",
]

# What each journal step of a running apply waits for, in words (the CLI's progress line).
_WAITS = {
    ApplyStep.PLANNED: "reading the baseline window",
    ApplyStep.BASELINE: "about to drain",
    ApplyStep.DRAINING: "draining the old server (in-flight requests finish first)",
    ApplyStep.STOPPED: "starting the new server",
    ApplyStep.STARTING: "starting the new server",
    ApplyStep.HEALTH_CHECK: "waiting for the new server's health gate (/health, then one real request)",
    ApplyStep.HEALTHY: "observing the new flags",
    ApplyStep.OBSERVING: "observing the new flags",
    ApplyStep.RESTORING: "restoring the previous flags",
    ApplyStep.HOOK: "running the apply hook",
    ApplyStep.RECONCILE: "finishing what a stopped tuner left half done",
    ApplyStep.PATCH: "patching the workload's container args",
    ApplyStep.ROLLOUT: "Kubernetes rolls the pods (tuner follows)",
}


@dataclass
class PendingApply:
    """An apply planned and not started: what it would change, and what it would cost."""

    applier: Applier
    rec_id: int
    plan: Plan

    def describe(self) -> str:
        return self.applier.describe(self.plan)

    def expected_outage(self) -> tuple[float, int] | None:
        """(median seconds without service, how many earlier applies that is from); None by hand or unknown."""
        return self.applier.observer.expected_outage(self.plan.target) if self.plan.route.outage else None

    def go(self, *, mode: str = "manual", force: bool = False, canary: bool = False) -> jr.StoredApply:
        if canary:
            return self.applier.canary(self.rec_id, mode=mode, force=force)
        return self.applier.apply(self.rec_id, mode=mode, force=force)


def plan(session: Session, rec_id: int, say: Callable[[str], None] = print) -> PendingApply:
    """What applying a proposed recommendation would do (NotProposedError otherwise); nothing changes yet.

    An apply left half done by a dead tuner is reconciled first: it must not block, or confuse, this one."""
    ap = session.applier(say)
    ap.reconcile()
    return PendingApply(ap, rec_id, ap.plan(admit.fresh(ap, rec_id)))


def waiting_on(session: Session, target: str, now: float) -> str | None:
    """What the target's running apply waits for now, and for how long (None: no apply is running)."""
    open_ids = jr.open_applies_for(session.store.engine, target)
    if not open_ids:
        return None
    a = jr.get_apply(session.store.engine, max(open_ids))
    last = a.steps[-1] if a.steps else None
    if last is None:
        return None
    since = max(0.0, now - last["ts_ms"] / 1000)
    return f"apply #{a.id}: {_WAITS.get(last['step'], last['step'])} ({since:.0f}s)"


def start(applier: Applier, *, rec_id: int | None = None, target: str | None = None, mode: str = "api") -> Opened:
    """Open an apply of ``rec_id`` (or a rollback of ``target``) now and return it to be carried out (``run``, e.g. on
    another thread): its journal entry holds the target and its replica group from here. The refusal is raised
    instead, before anything changed: NotProposedError, UnknownTargetError, TargetBusyError naming the apply that
    holds the target, ApplyError (nothing to roll back, a stale proposal, the restart budget). The journal's unique
    index decides between two requests at the same instant: one opens, the other is refused."""
    if rec_id is not None:
        return applier.open_apply(rec_id, mode=mode)
    return applier.open_rollback(str(target), mode=mode)


def apply(
    session: Session, rec_id: int, *, mode: str = "manual", force: bool = False, say: Callable[[str], None] = print
) -> jr.StoredApply:
    return plan(session, rec_id, say).go(mode=mode, force=force)


def applied_by_hand(
    session: Session, rec_id: int, *, cancel: bool = False, say: Callable[[str], None] = print
) -> jr.StoredApply:
    return session.applier(say).manual_done(rec_id, cancel=cancel)


def rollback(
    session: Session, target: str, *, mode: str = "manual", force: bool = False, say: Callable[[str], None] = print
) -> jr.StoredApply:
    ap = session.applier(say)
    ap.reconcile()
    return ap.rollback(target, mode=mode, force=force)


def reconcile(session: Session, say: Callable[[str], None] = print) -> list[str]:
    return session.applier(say).reconcile()


def journal(session: Session, target: str | None = None, limit: int = 20) -> list[jr.StoredApply]:
    """The journal as it is shown (CLI, API): credentials redacted (shown())."""
    return [shown(session.cfg, a) for a in jr.list_applies(session.store.engine, target=target, limit=limit)]


def shown(cfg: Config, a: jr.StoredApply) -> jr.StoredApply:
    """An apply as it may be shown: the values of secret flags in its argv, and every credential the config holds
    anywhere in its steps and note, as *** (rows written before redaction existed too). The store keeps the argv
    as run: a restore needs it."""

    def argv(args: list[str]) -> list[str]:
        return [cfg.redact(x) for x in redact_argv(args)]

    return replace(
        a,
        old_argv=argv(a.old_argv),
        new_argv=argv(a.new_argv),
        note=cfg.redact(a.note),
        steps=[{**s, "detail": cfg.redact(s["detail"])} for s in a.steps],
    )


def held(session: Session, a: jr.StoredApply) -> bool:
    """Whether the change stands as the caller asked: kept, inconclusive under ``on_inconclusive: keep``, or
    waiting for a restart by hand."""
    keep_new = a.outcome == ApplyOutcome.INCONCLUSIVE and session.cfg.target(a.target).apply.on_inconclusive == "keep"
    return a.outcome == ApplyOutcome.KEPT or keep_new or a.state == ApplyState.AWAITING_MANUAL


def managed_targets(session: Session, name: str | None) -> list[Target]:
    """The named target (ApplyError unless it is managed), else every managed one."""
    if name is None:
        return [t for t in session.cfg.targets if t.managed]
    t = session.cfg.target(name)
    if t.managed is None:
        raise ApplyError(f"target {t.name!r} is not managed (no managed: section)")
    return [t]


def haproxy_config_for(cfg: Config, group: str) -> str:
    """The HAProxy config tuner expects in front of replica group ``group``, or of blue/green target ``group``
    (ConfigError naming what is missing)."""
    single = next((t for t in cfg.targets if t.name == group and t.balancer is not None and t.group is None), None)
    if single is not None:
        b = single.balancer
        assert b is not None and b.server is not None
        if b.frontend is None:
            raise ConfigError(
                "config",
                f"targets[{group}].balancer.frontend",
                "give the HOST:PORT where HAProxy listens for this server's clients",
            )
        return haproxy_config(
            frontend=b.frontend, socket_path=b.socket, backend=b.backend, servers=[(b.server, *single.host_port)]
        )
    members = [t for t in cfg.targets if t.group == group]
    if not members:
        groups = sorted({t.group or t.name for t in cfg.targets if t.balancer is not None})
        raise ConfigError(
            "config",
            f"targets[{group}].replicas",
            f"no replica group or blue/green target of that name; there are: {', '.join(groups) or 'none'}",
        )
    b, front = members[0].balancer, members[0].group_url
    assert b is not None and front is not None
    servers = [(m.replica or m.name, *m.host_port) for m in members]
    host, port = members[0].model_copy(update={"url": front}).host_port
    return haproxy_config(frontend=f"{host}:{port}", socket_path=b.socket, backend=b.backend, servers=servers)
