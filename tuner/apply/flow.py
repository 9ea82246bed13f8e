"""Applying flags to a server, journaled step by step: drain, start, health gate, observe, keep or roll back.

How the change reaches the server is its route (routes.py: managed, an argv hook, a systemd drop-in, by hand);
this module is the same for every route: plan, journal, switch, observe, judge (verdict.py), restore.
A managed start that fails restores the previous flags at once and records the server's own error line.
After the gate tuner observes for ``apply.observe`` and compares the window after with the window before.
Every step is journaled before it is taken (tuner/store/journal.py); ``reconcile`` finishes what a dead tuner
left half done.

Opening an apply is its own step (``open_apply``, ``open_rollback``): the journal entry it opens holds the target
(and its replica group), or the refusal names what holds it, before anything is changed; the caller carries it out
(``Opened.run``) then or on another thread. The API answers 202 or 409 from the first step.

Beside it: admit.py (what may start), servers.py (the managed servers, the flags in force), observe.py (the
windows and the observation), canary.py, restart.py, manual.py (the other flows), reconcile.py (crash safety).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.apply import admit, claims, manual
from tuner.apply import canary as canaries
from tuner.apply import managed as mg
from tuner.apply import reconcile as reconciler
from tuner.apply.observe import Observer, cost
from tuner.apply.port import Plan
from tuner.apply.routes import flags_argv, route_for
from tuner.apply.servers import Servers, flags_in_force
from tuner.apply.verdict import Verdict
from tuner.config import Config, Target
from tuner.errors import ApplyError, ServerStartError, StoreError
from tuner.flags import validate
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store.journal import ApplyOutcome, ApplyState, ApplyStep, ServerState
from tuner.store.recommendations import RecStatus

__all__ = ["Applier", "Opened", "Plan", "Restored", "own_identity"]


@dataclass(frozen=True)
class Restored:
    """How putting the previous flags back went: ``failed`` is what callers decide on, ``text`` goes in notes."""

    failed: bool
    text: str

    def __str__(self) -> str:
        return self.text


def own_identity() -> tuple[int, int]:
    """This process as the journal names an owner: pid and kernel start time (a reused pid is another process)."""
    return os.getpid(), mg.proc_start_time(os.getpid()) or 0


@dataclass
class Opened:
    """An apply or rollback whose journal entry is open (its target is held): ``run`` carries it out and returns the
    finished entry. Run it once; until it runs, no reconcile of this process touches the entry."""

    id: int
    target: str
    what: str
    _carry: Callable[[], jr.StoredApply]
    _release: Callable[[], None]

    def run(self) -> jr.StoredApply:
        try:
            return self._carry()
        finally:
            self._release()


@dataclass
class Applier:
    """Does applies for one config and store. ``say`` prints progress; ``clock`` is wall time and ``sleep``
    waits on it (tests inject both). ``room(target, flags)``: whether a second server of the target with those
    flags fits beside the running one, and why (the app's memory reading; blue/green asks it)."""

    cfg: Config
    store: Any  # tuner.store.Store
    config_dir: Path
    say: Callable[[str], None] = print
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    owner: tuple[int, int] = field(default_factory=own_identity)
    room: Callable[[Target, dict[str, Any]], tuple[bool, str]] | None = None

    def __post_init__(self) -> None:
        say = self.say  # what it says may quote an argv or a server's log: never a credential
        self.say = lambda text: say(self.cfg.redact(text))
        self.servers = Servers(self.cfg, self.store, self.config_dir, say=self.say, clock=self.clock)
        self.observer = Observer(self)

    @property
    def engine(self) -> Any:
        return self.store.engine

    # ---- the Steps port (port.py): what routes and tune ask of the flow; the servers are servers.py's ----

    def running(self, t: Target) -> mg.Running | None:
        return self.servers.running(t)

    def launch(
        self,
        t: Target,
        flags: dict[str, Any],
        *,
        restarts: list[int] | None = None,
        spawned: Callable[[mg.Running], None] | None = None,
    ) -> mg.Running:
        return self.servers.launch(t, flags, restarts=restarts, spawned=spawned)

    def drain(self, t: Target, r: mg.Running) -> str:
        return self.servers.drain(t, r)

    def in_flight(self, t: Target) -> int | None:
        return self.servers.in_flight(t)

    def flags_in_force(self, t: Target, *, journaled: bool = True) -> dict[str, Any]:
        return flags_in_force(self.engine, t, journaled=journaled)

    # ---- the flows that live beside this one: canary.py, manual.py, reconcile.py ------------------------

    def canary(self, rec_id: int, *, mode: str = "manual", force: bool = False) -> jr.StoredApply:
        return canaries.canary(self, rec_id, mode=mode, force=force)

    def manual_done(self, rec_id: int, *, cancel: bool = False) -> jr.StoredApply:
        return manual.manual_done(self, rec_id, cancel=cancel)

    def reconcile(self, *, only: Callable[[jr.StoredApply], bool] | None = None) -> list[str]:
        return reconciler.reconcile(self, only=only)

    # ---- planning ------------------------------------------------------------------------------

    def plan(self, rec: recs.StoredRecommendation) -> Plan:
        t = self.cfg.target(rec.target)
        if "backend" in rec.diff:
            raise ApplyError(
                f"recommendation #{rec.id} changes the backend to {rec.diff['backend']}: that is a "
                "migration to another server, not a flag change; tuner does not apply it"
            )
        diff = {name: validate(t.backend, name, value) for name, value in rec.diff.items()}
        return self.plan_diff(t, diff)

    def plan_diff(self, t: Target, diff: dict[str, Any]) -> Plan:
        """The plan of setting ``diff`` on ``t`` over the flags in force (a rollback's, a test's)."""
        old = self.flags_in_force(t)
        new = {**old, **diff}
        route = route_for(t)
        return Plan(t, route, diff, old, new, route.argv(t, old, old), route.argv(t, new, diff))

    def describe(self, p: Plan) -> str:
        lines = [f"target {p.target.name} ({p.target.backend}, {p.how})"]
        for name, value in p.diff.items():
            lines.append(f"  {name}: {p.old_flags.get(name, '(default)')} -> {value}")
        return self.cfg.redact("\n".join(lines + p.route.describe(p)))

    # ---- apply -----------------------------------------------------------------------------------

    def apply(self, rec_id: int, *, mode: str = "manual", force: bool = False) -> jr.StoredApply:
        return self.open_apply(rec_id, mode=mode, force=force).run()

    def open_apply(self, rec_id: int, *, mode: str = "manual", force: bool = False) -> Opened:
        """Open the apply of ``rec_id`` in the journal (its target is held from here) and return it to be carried
        out; the refusal instead when it may not start (TargetBusyError naming the apply that holds the target or
        its group, NotProposedError, a stale proposal, the restart budget)."""
        rec = admit.fresh(self, rec_id)
        p = self.plan(rec)
        if p.route.restarts and not force:
            admit.check_restart_budget(self, p.target)
        aid = self.begin(p, rec.id, "apply", mode)
        what = f"apply of recommendation #{rec.id}"
        if not p.route.restarts:
            return self.opened(aid, p, what, lambda: manual.await_manual(self, aid, p, rec.id))
        return self.opened(aid, p, what, lambda: self._carry_out(aid, p, rec.id))

    def opened(self, aid: int, p: Plan, what: str, carry: Callable[[], jr.StoredApply]) -> Opened:
        return Opened(aid, p.target.name, what, carry, lambda: claims.drop(self.engine, aid))

    def switch_failed(
        self, aid: int, p: Plan, rec_id: int | None, exc: ServerStartError | ApplyError, *, mark: bool = True
    ) -> jr.StoredApply:
        line = p.route.why_failed(self, p.target, exc)
        self.step(aid, ApplyStep.START_FAILED, line)
        restored = self.restore(aid, p)
        note = f"the server did not take the new flags: {line}; {restored}"
        jr.finish(self.engine, aid, ApplyOutcome.FAILED, note, now=self.clock())
        if rec_id is not None and mark:
            recs.set_status(self.engine, rec_id, RecStatus.FAILED, now=self.clock(), note=line)
        return jr.get_apply(self.engine, aid)

    def rollback(self, target: str, *, mode: str = "manual", force: bool = False) -> jr.StoredApply:
        return self.open_rollback(target, mode=mode, force=force).run()

    def open_rollback(self, target: str, *, mode: str = "manual", force: bool = False) -> Opened:
        """Open the rollback of ``target``'s last kept apply in the journal and return it to be carried out; the
        refusal instead (nothing to roll back, TargetBusyError, the restart budget)."""
        t = self.cfg.target(target)
        if not force:
            admit.check_restart_budget(self, t)
        last = next((a for a in jr.list_applies(self.engine, target=target) if jr.new_flags_stand(a)), None)
        if last is None:
            raise ApplyError(f"{target}: no kept apply to roll back (see `tuner journal {target}`)")
        current = self.flags_in_force(t)
        diff = {k: v for k, v in last.old_flags.items() if current.get(k) != v}
        for k in current:
            if k not in last.old_flags:
                raise ApplyError(f"{target}: flag {k} was not set before apply #{last.id}; set it in the config")
        p = self.plan_diff(t, diff)
        aid = self.begin(p, last.recommendation_id, "rollback", mode)
        return self.opened(
            aid,
            p,
            f"rollback of {t.name}",
            lambda: self._carry_out(aid, p, last.recommendation_id, rollback_of=last.id),
        )

    def begin(self, p: Plan, rec_id: int | None, kind: str, mode: str) -> int:
        """Open the journal entry (TargetBusyError when the target or its group is held: the journal's unique index
        decides) and take it for this thread."""
        return self.hold(
            p.target,
            kind=kind,
            mode=mode,
            rec_id=rec_id,
            diff=p.diff,
            old_flags=p.old_flags,
            new_flags=p.new_flags,
            old_argv=p.old_argv,
            new_argv=p.new_argv,
        )

    def hold(
        self,
        t: Target,
        *,
        kind: str,
        mode: str,
        rec_id: int | None = None,
        diff: dict[str, Any] | None = None,
        old_flags: dict[str, Any],
        new_flags: dict[str, Any],
        old_argv: list[str],
        new_argv: list[str],
    ) -> int:
        """Open a journal entry holding ``t`` and its replica group, owned by this tuner and taken by this thread
        (``release`` when done without ``run``): an apply's, or a tuning run's (kind ``tune``)."""
        try:
            aid = jr.begin_apply(
                self.engine,
                target=t.name,
                recommendation_id=rec_id,
                kind=kind,
                mode=mode,
                now=self.clock(),
                diff=diff or {},
                old_flags=old_flags,
                new_flags=new_flags,
                old_argv=old_argv,
                new_argv=new_argv,
                owner_pid=self.owner[0],
                owner_start=self.owner[1],
                group=t.group,
            )
        except StoreError as exc:
            raise ApplyError(str(exc)) from None
        claims.take(self.engine, aid)
        return aid

    def release(self, aid: int) -> None:
        """This thread is done with entry ``aid`` (finished, or left for a reconcile)."""
        claims.drop(self.engine, aid)

    def step(self, aid: int, name: str, detail: str = "", state: ApplyState | None = None) -> None:
        detail = self.cfg.redact(detail)  # a step's argv is shown (journal, API): its credentials are not
        jr.step(self.engine, aid, name, detail, now=self.clock(), state=state)
        self.say(f"[apply #{aid}] {name}" + (f": {detail}" if detail else ""))

    def _carry_out(self, aid: int, p: Plan, rec_id: int | None, *, rollback_of: int | None = None) -> jr.StoredApply:
        t = p.target
        wait = p.route.restarts and rollback_of is None and t.apply.on_inconclusive == "rollback"
        base = self.observer.baseline(aid, t, group=p.whole_group, wait=wait)
        now = self.clock()
        if p.route.restarts and rollback_of is None:
            base["in_flight_at_drain"] = p.route.in_flight(self, t)  # None: not read, or no answer in time
        jr.set_kpis(self.engine, aid, now=now, baseline=base)
        self.step(aid, ApplyStep.BASELINE, json.dumps(base, default=str))
        try:
            p.route.switch(self, aid, p, p.new_flags, p.diff)
        except (ServerStartError, ApplyError) as exc:
            return self.switch_failed(aid, p, rec_id, exc, mark=rollback_of is None)
        if rollback_of is not None:
            note = f"restored the flags from before apply #{rollback_of}"
            jr.finish(self.engine, aid, ApplyOutcome.ROLLED_BACK, note, now=self.clock())
            if rec_id is not None:
                recs.set_status(
                    self.engine, rec_id, RecStatus.ROLLED_BACK, now=self.clock(), note=f"tuner rollback {t.name}"
                )
            return jr.get_apply(self.engine, aid)
        return self.observe_and_judge(aid, p, rec_id, base)

    def observe_and_judge(
        self, aid: int, p: Plan, rec_id: int | None, base: dict[str, Any], prefix: str = ""
    ) -> jr.StoredApply:
        t = p.target

        def verdict(t0: float, now: float) -> Verdict:
            before = tuple(base.get("window") or (t0 - t.apply.baseline.total_seconds(), t0))
            return self.observer.judge_windows(t, (float(before[0]), float(before[1])), (t0, now), group=p.whole_group)

        died, v, t0, now = self.observer.observe(
            aid, t, f"the replicas of {t.group} together, " if p.whole_group else "", verdict
        )
        after = self.observer.kpis(t, t0, now, group=p.whole_group)
        if p.route.outage:
            after.update(cost(jr.get_apply(self.engine, aid), base))
        jr.set_kpis(self.engine, aid, now=now, after=after)
        if died or v is None:
            outcome, reason = ApplyOutcome.ROLLED_BACK, f"the server died while observed: {died}"
        else:
            outcome, reason = v.outcome, f"{v.reason} (confidence {v.confidence:.2f}; {v.test})"
        if v is not None and v.slo is not None:
            self.step(aid, ApplyStep.SLO, v.slo.line())  # the SLO line first, before the verdict it led
        self.step(aid, ApplyStep.VERDICT, f"{outcome}: {reason}")
        if outcome == ApplyOutcome.KEPT or (outcome == ApplyOutcome.INCONCLUSIVE and t.apply.on_inconclusive == "keep"):
            if outcome == ApplyOutcome.INCONCLUSIVE:
                reason += "; the new flags stay (apply.on_inconclusive: keep)"
            jr.finish(self.engine, aid, outcome, prefix + reason, now=self.clock())
            if rec_id is not None:
                recs.set_status(self.engine, rec_id, "applied", now=self.clock(), note=prefix + reason)
            admit.expire_stale(self, t, aid)
            return jr.get_apply(self.engine, aid)
        if outcome == ApplyOutcome.INCONCLUSIVE:
            reason += (
                "; the previous flags are restored (apply.on_inconclusive: rollback)"
                if p.route.restarts
                else "; apply.on_inconclusive: rollback"
            )
        if not p.route.restarts:
            note = (
                f"{prefix}{reason}; tuner does not restart this server: restart it by hand with "
                f"{' '.join(flags_argv(t.backend, p.old_flags))}"
            )
            self.step(aid, ApplyStep.RESTORE_BY_HAND, " ".join(flags_argv(t.backend, p.old_flags)))
            # no data judges nothing: an inconclusive verdict stays inconclusive, never a failure
            closed = ApplyOutcome.INCONCLUSIVE if outcome == ApplyOutcome.INCONCLUSIVE else ApplyOutcome.FAILED
            jr.finish(self.engine, aid, closed, note, now=self.clock())
        else:
            restored = self.restore(aid, p)
            jr.finish(self.engine, aid, outcome, f"{prefix}{reason}; {restored}", now=self.clock())
        if rec_id is not None:
            recs.set_status(self.engine, rec_id, RecStatus.ROLLED_BACK, now=self.clock(), note=prefix + reason)
        return jr.get_apply(self.engine, aid)

    def restore(self, aid: int, p: Plan) -> Restored:
        """Back to the old flags; whether that failed, and a description for the note."""
        t = p.target
        self.step(aid, ApplyStep.RESTORING, json.dumps(p.old_argv), state=ApplyState.STARTING)
        try:
            if not p.route.restore(self, aid, p):
                return Restored(False, "restore it by hand")
        except (ServerStartError, ApplyError) as exc:
            first = str(exc).splitlines()[0]
            self.step(aid, ApplyStep.RESTORE_FAILED, first)
            if t.managed is not None:
                self.servers.save(t, None, p.old_flags, ServerState.CRASHED, note=first)
            return Restored(True, f"restoring the previous flags FAILED too: {first}")
        self.step(aid, ApplyStep.RESTORED, "previous flags, healthy")
        return Restored(False, "previous flags restored and healthy")
