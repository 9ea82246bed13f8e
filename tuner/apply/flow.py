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
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.apply import managed as mg
from tuner.apply.port import Canaried, Plan
from tuner.apply.routes import ROUTES, flags_argv, route_for
from tuner.apply.verdict import Verdict, judge
from tuner.backends import backend as backend_of
from tuner.collect.scrape import scrape_target
from tuner.config import Config, Target
from tuner.errors import ApplyError, FlagError, NotProposedError, ServerStartError, StoreError, TunerError
from tuner.flags import spec, validate
from tuner.signals.load import LoadProfile, group_profile, profile
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store.journal import ApplyOutcome, ApplyState, ServerState
from tuner.store.recommendations import RecStatus

__all__ = ["Applier", "Opened", "Plan", "Restored", "flags_in_force", "own_identity", "proposed", "stale"]

_OBSERVE_POLL_S = 1.0
_IN_FLIGHT_TIMEOUT_S = 15.0


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


# Journal entries a thread of this process is carrying out, by (database, id): the journal names this process as
# their owner, alive, so only this set tells a reconcile in another thread (auto mode reconciles before each step)
# that the entry is not a leftover. Taking an id in it is how a thread claims an entry within the process.
_carried: set[tuple[str, int]] = set()
_carried_lock = threading.Lock()


def _take(engine: Any, aid: int) -> bool:
    with _carried_lock:
        if (str(engine.url), aid) in _carried:
            return False
        _carried.add((str(engine.url), aid))
        return True


def _drop(engine: Any, aid: int) -> None:
    with _carried_lock:
        _carried.discard((str(engine.url), aid))


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


def _canonical(backend: str, flags: dict[str, Any]) -> dict[str, Any]:
    """Flags by tuner's names, validated; names not on the allow-list are not tuner's business and are left out."""
    out = {}
    for name, value in flags.items():
        for candidate in (name, "--" + name):
            try:
                s = spec(backend, candidate)
            except FlagError:
                continue
            out[s.name] = validate(backend, s.name, value)
            break
    return out


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


def flags_in_force(engine: Any, t: Target, *, journaled: bool = True) -> dict[str, Any]:
    """The tunable flags the target runs with, as tuner knows them (tuner's names). ``journaled=False``: the
    caller knows the journal holds no apply of the target (a fleet asks for every target at once).

    Managed: what tuner last started it with, unless the config's flags changed since (then the config's).
    Otherwise: the flags of the last apply whose new flags stand (kept, or inconclusive under on_inconclusive: keep) or of the
    last rollback, else the config's ``flags``.
    """
    if t.managed is not None:
        st = jr.get_managed(engine, t.name)
        base = _canonical(t.backend, dict(t.managed.flags))
        return dict(st.flags) if st is not None and st.config_flags == base else base
    if not journaled:
        return _canonical(t.backend, dict(t.flags))
    for a in jr.list_applies(engine, target=t.name):
        if jr.new_flags_stand(a) or (
            a.state == ApplyState.DONE and (a.kind, a.outcome) == ("rollback", ApplyOutcome.ROLLED_BACK)
        ):
            return dict(a.new_flags)
    return _canonical(t.backend, dict(t.flags))


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

    @property
    def engine(self) -> Any:
        return self.store.engine

    # ---- managed servers -----------------------------------------------------------------------

    def config_flags(self, t: Target) -> dict[str, Any]:
        assert t.managed is not None
        return _canonical(t.backend, dict(t.managed.flags))

    def flags_in_force(self, t: Target, *, journaled: bool = True) -> dict[str, Any]:
        return flags_in_force(self.engine, t, journaled=journaled)

    def running(self, t: Target) -> mg.Running | None:
        st = jr.get_managed(self.engine, t.name)
        if st is None or not mg.is_alive(st.pid, st.proc_start):
            return None
        assert st.pid is not None and st.proc_start is not None
        return mg.Running(st.pid, st.proc_start, st.argv, mg.log_path(t, self.config_dir))

    def save_managed(
        self,
        t: Target,
        r: mg.Running | None,
        flags: dict[str, Any],
        state: str,
        note: str = "",
        restarts: list[int] | None = None,
    ) -> None:
        old = jr.get_managed(self.engine, t.name)
        now_ms = int(self.clock() * 1000)
        jr.save_managed(
            self.engine,
            jr.ManagedState(
                target=t.name,
                pid=r.pid if r else None,
                proc_start=r.start if r else None,
                argv=r.argv if r else (old.argv if old else []),
                flags=flags,
                config_flags=self.config_flags(t),
                started_ms=now_ms if r else (old.started_ms if old else now_ms),
                restarts=restarts if restarts is not None else (old.restarts if old else []),
                state=state,
                updated_ms=now_ms,
                note=note,
            ),
        )

    def launch(
        self,
        t: Target,
        flags: dict[str, Any],
        *,
        restarts: list[int] | None = None,
        spawned: Callable[[mg.Running], None] | None = None,
    ) -> mg.Running:
        """Start the managed server with ``flags``, record it, wait for the health gate. ServerStartError if not.

        ``spawned`` is told as soon as the process exists (the journal's health_check step starts there).
        """
        assert t.managed is not None
        argv = mg.build_argv(t, flags)
        r = mg.start_server(argv, mg.server_env(t), mg.log_path(t, self.config_dir), nice=t.managed.nice)
        self.save_managed(t, r, flags, ServerState.RUNNING, restarts=restarts)
        if spawned is not None:
            spawned(r)
        try:
            took = mg.wait_healthy(r, t.url, t.managed.start_timeout.total_seconds())
            gate = mg.health_gate(t)
        except ServerStartError:
            # Up but not serving (or never up): stop it, or it would hold the port against the next start.
            mg.stop_server(r, grace_s=5.0)
            self.save_managed(t, None, flags, ServerState.CRASHED, restarts=restarts)
            raise
        self.say(f"{t.name}: healthy after {took:.1f}s ({gate}); pid {r.pid}")
        return r

    def start(self, t: Target) -> mg.Running:
        if t.managed is None:
            raise ApplyError(f"target {t.name!r} is not managed (no managed: section); tuner cannot start it")
        r = self.running(t)
        if r is not None:
            self.say(f"{t.name}: already running, pid {r.pid}")
            return r
        flags = self.flags_in_force(t)
        try:
            return self.launch(t, flags)
        except ServerStartError as exc:
            self.save_managed(t, None, flags, ServerState.CRASHED, note=str(exc).splitlines()[0])
            raise

    def stop(self, t: Target, *, state: str = ServerState.STOPPED) -> str:
        r = self.running(t)
        how = "was not running" if r is None else self.drain(t, r)
        self.save_managed(t, None, self.flags_in_force(t) if t.managed else {}, state)
        return how

    def drain(self, t: Target, r: mg.Running) -> str:
        assert t.managed is not None
        grace = t.managed.drain_timeout.total_seconds()
        if backend_of(t.backend).drain == "slots_idle":
            # llama-server stops decoding at the first signal but exits only at the second (bench/results/
            # 2026-11-21-1037-apply.md): waiting longer in between only keeps connections hanging.
            idle = mg.drain_llama(t.url, grace)
            return f"{idle}; " + mg.stop_server(r, grace_s=0.5)
        # vLLM got --shutdown-timeout: on SIGTERM it finishes in-flight requests for up to that long.
        return mg.stop_server(r, grace_s=grace + 15.0)

    def supervise(self, t: Target) -> str | None:
        """Start a managed server that should run and does not; restarts after a crash are bounded."""
        if t.managed is None or self._busy(t, shadow=False):  # a tune beside production: keep production up
            return None
        st = jr.get_managed(self.engine, t.name)
        if st is not None and st.state in (ServerState.STOPPED, ServerState.GIVEN_UP):
            return None
        if st is not None and mg.is_alive(st.pid, st.proc_start):
            return None
        now = self.clock()
        window_ms = t.managed.restart_window.total_seconds() * 1000
        restarts = [ms for ms in (st.restarts if st else []) if ms >= now * 1000 - window_ms]
        if st is not None and st.state in (ServerState.RUNNING, ServerState.CRASHED):
            why = mg.error_line(mg.log_path(t, self.config_dir))
            if len(restarts) >= t.managed.max_restarts:
                self.save_managed(
                    t,
                    None,
                    st.flags,
                    ServerState.GIVEN_UP,
                    note=f"{len(restarts)} restarts in "
                    f"{t.managed.restart_window.total_seconds():.0f}s; last error: {why}",
                    restarts=restarts,
                )
                return f"{t.name}: gave up after {len(restarts)} restarts (last error: {why})"
            restarts.append(int(now * 1000))
            self.say(f"{t.name}: server died ({why}); restart {len(restarts)} of {t.managed.max_restarts}")
        try:
            self.launch(t, self.flags_in_force(t), restarts=restarts)
        except ServerStartError as exc:
            self.save_managed(
                t, None, self.flags_in_force(t), ServerState.CRASHED, note=str(exc).splitlines()[0], restarts=restarts
            )
            return f"{t.name}: start failed: {str(exc).splitlines()[0]}"
        return f"{t.name}: started"

    # ---- planning ------------------------------------------------------------------------------

    def plan(self, rec: recs.StoredRecommendation) -> Plan:
        t = self.cfg.target(rec.target)
        if "backend" in rec.diff:
            raise ApplyError(
                f"recommendation #{rec.id} changes the backend to {rec.diff['backend']}: that is a "
                "migration to another server, not a flag change; tuner does not apply it"
            )
        diff = {name: validate(t.backend, name, value) for name, value in rec.diff.items()}
        return self._plan(t, diff)

    def _plan(self, t: Target, diff: dict[str, Any]) -> Plan:
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

    def check_restart_budget(self, t: Target) -> None:
        """ApplyError when the target's server was started max_restarts_per_hour times in the last hour."""
        since = (self.clock() - 3600) * 1000
        starts = sum(
            1
            for a in jr.list_applies(self.engine, target=t.name, limit=200)
            for s in a.steps
            if s["step"] in ("starting", "restoring") and s["ts_ms"] >= since
        )
        if starts >= t.apply.max_restarts_per_hour:
            raise ApplyError(
                f"{t.name}: {starts} server starts by applies in the last hour (apply.max_restarts_per_"
                f"hour {t.apply.max_restarts_per_hour}); wait, or pass --force"
            )

    def fresh(self, rec_id: int) -> recs.StoredRecommendation:
        """The proposal, if it may be applied and still fits the flags in force; else it is expired (with why)
        and ApplyError says so."""
        rec = proposed(self.engine, rec_id)
        t = self.cfg.target(rec.target)
        why = stale(rec, self.flags_in_force(t))
        if why is not None:
            recs.set_status(self.engine, rec.id, "expired", now=self.clock(), note=why)
            raise ApplyError(
                f"recommendation #{rec.id} for {t.name}: {why}; it is expired (`tuner recommend "
                f"{t.name}` proposes against the flags in force)"
            )
        return rec

    def expire_stale(self, t: Target, apply_id: int) -> list[int]:
        """After an apply changed the flags of ``t`` (and of every replica of its group): the proposals for them
        that no longer fit are expired, so none is applied against flags that are gone. Returns their ids."""
        done = []
        for m in self.cfg.group(t):
            in_force = self.flags_in_force(m)
            for rec in recs.proposed_for(self.engine, m.name):
                why = stale(rec, in_force)
                if why is not None:
                    recs.set_status(self.engine, rec.id, "expired", now=self.clock(), note=f"{why} (apply #{apply_id})")
                    done.append(rec.id)
        return done

    def apply(self, rec_id: int, *, mode: str = "manual", force: bool = False) -> jr.StoredApply:
        return self.open_apply(rec_id, mode=mode, force=force).run()

    def open_apply(self, rec_id: int, *, mode: str = "manual", force: bool = False) -> Opened:
        """Open the apply of ``rec_id`` in the journal (its target is held from here) and return it to be carried
        out; the refusal instead when it may not start (TargetBusyError naming the apply that holds the target or
        its group, NotProposedError, a stale proposal, the restart budget)."""
        rec = self.fresh(rec_id)
        p = self.plan(rec)
        if p.route.restarts and not force:
            self.check_restart_budget(p.target)
        aid = self._begin(p, rec.id, "apply", mode)
        what = f"apply of recommendation #{rec.id}"
        if not p.route.restarts:
            return self._opened(aid, p, what, lambda: self._await_manual(aid, p, rec.id))
        return self._opened(aid, p, what, lambda: self._carry_out(aid, p, rec.id))

    def _opened(self, aid: int, p: Plan, what: str, carry: Callable[[], jr.StoredApply]) -> Opened:
        return Opened(aid, p.target.name, what, carry, lambda: _drop(self.engine, aid))

    def canary(self, rec_id: int, *, mode: str = "manual", force: bool = False) -> jr.StoredApply:
        """A replica group's canary: part of the group takes the new flags (the recommendation's replica behind a
        balancer; a Kubernetes workload's canary Deployment), the rest keeps the old ones, both serve the same live
        traffic, and the verdict compares the canary with the control over the same window (same offered load by
        construction). Kept: the rest of the group rolls. Otherwise the canary goes back."""
        rec = self.fresh(rec_id)
        p = self.plan(rec)
        t = p.target
        if not isinstance(p.route, Canaried):
            raise ApplyError(
                f"{t.name} is not a replica of a group behind a balancer: a canary needs peers serving "
                "the same traffic to compare with (replicas: and balancer: in its config, or "
                "kubernetes.canary and kubernetes.pods)"
            )
        route: Canaried = p.route
        if not force:
            self.check_restart_budget(t)
        aid = self._begin(p, rec.id, "canary", mode)
        return self._opened(
            aid, p, f"canary of recommendation #{rec.id}", lambda: self._canary(aid, p, rec, route)
        ).run()

    def _canary(self, aid: int, p: Plan, rec: recs.StoredRecommendation, route: Canaried) -> jr.StoredApply:
        t = p.target
        try:
            (canary, canary_in), (control, control_in) = route.canary(self, aid, p)
        except (ServerStartError, ApplyError) as exc:
            return self._switch_failed(aid, p, rec.id, exc)
        died, v, t0, now = self._observe(
            aid,
            t,
            f"canary {canary} against control {control}, same window, ",
            lambda t0, now: judge(
                self._served(t, control_in, t0, now),
                self._served(t, canary_in, t0, now),
                min_requests=t.apply.min_requests,
            ),
        )
        # the journal's "before" is the control, its "after" the canary: the same window, side by side
        jr.set_kpis(
            self.engine,
            aid,
            now=now,
            baseline={"replica": control, **self._kpis_of(t, control_in, t0, now)},
            after={"replica": canary, **self._kpis_of(t, canary_in, t0, now)},
        )
        if died or v is None:
            outcome, reason = ApplyOutcome.ROLLED_BACK, f"the canary died while observed: {died}"
        else:
            outcome, reason = (
                v.outcome,
                (f"canary against control over the same window: {v.reason} (confidence {v.confidence:.2f}; {v.test})"),
            )
        if v is not None and v.slo is not None:
            self.step(aid, "slo", v.slo.line())
        self.step(aid, "verdict", f"{outcome}: {reason}")
        if outcome == ApplyOutcome.KEPT or (outcome == ApplyOutcome.INCONCLUSIVE and t.apply.on_inconclusive == "keep"):
            if outcome == ApplyOutcome.INCONCLUSIVE:
                reason += "; the new flags stay (apply.on_inconclusive: keep)"
            try:
                route.promote(self, aid, p)
            except (ServerStartError, ApplyError) as exc:
                return self._switch_failed(aid, p, rec.id, exc)
            jr.finish(self.engine, aid, outcome, reason + "; rolled out to the group", now=self.clock())
            recs.set_status(self.engine, rec.id, "applied", now=self.clock(), note=reason)
            self.expire_stale(t, aid)
            return jr.get_apply(self.engine, aid)
        if outcome == ApplyOutcome.INCONCLUSIVE:
            reason += "; the previous flags are restored (apply.on_inconclusive: rollback)"
        restored = self._restore(aid, p)
        jr.finish(self.engine, aid, outcome, f"{reason}; {restored}; the control was never changed", now=self.clock())
        recs.set_status(self.engine, rec.id, RecStatus.ROLLED_BACK, now=self.clock(), note=reason)
        return jr.get_apply(self.engine, aid)

    def _switch_failed(
        self, aid: int, p: Plan, rec_id: int | None, exc: ServerStartError | ApplyError, *, mark: bool = True
    ) -> jr.StoredApply:
        line = p.route.why_failed(self, p.target, exc)
        self.step(aid, "start_failed", line)
        restored = self._restore(aid, p)
        jr.finish(
            self.engine,
            aid,
            ApplyOutcome.FAILED,
            f"the server did not take the new flags: {line}; {restored}",
            now=self.clock(),
        )
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
            self.check_restart_budget(t)
        last = next((a for a in jr.list_applies(self.engine, target=target) if jr.new_flags_stand(a)), None)
        if last is None:
            raise ApplyError(f"{target}: no kept apply to roll back (see `tuner journal {target}`)")
        current = self.flags_in_force(t)
        diff = {k: v for k, v in last.old_flags.items() if current.get(k) != v}
        for k in current:
            if k not in last.old_flags:
                raise ApplyError(f"{target}: flag {k} was not set before apply #{last.id}; set it in the config")
        p = self._plan(t, diff)
        aid = self._begin(p, last.recommendation_id, "rollback", mode)
        return self._opened(
            aid,
            p,
            f"rollback of {t.name}",
            lambda: self._carry_out(aid, p, last.recommendation_id, rollback_of=last.id),
        )

    def restart(self, target: str, *, reason: str, mode: str = "auto", force: bool = False) -> jr.StoredApply:
        """Restart a managed server with the flags it runs with, journaled as a ``restart``: for a server whose process
        lives on but does not serve (a stalled engine), which the supervisor leaves alone. The guardrails of an apply
        hold: the restart budget (apply.max_restarts_per_hour; ApplyError unless ``force``), and one change at a time
        on the target and its group (the journal's lock). The server alone, not its group; no verdict (nothing
        changed to judge). Outcome kept (up and through the health gate again) or failed."""
        t = self.cfg.target(target)
        if t.managed is None:
            raise ApplyError(f"target {t.name!r} is not managed (no managed: section); tuner cannot restart it")
        if not force:
            self.check_restart_budget(t)
        flags = self.flags_in_force(t)
        route = ROUTES["managed"]
        argv = route.argv(t, flags, {})
        p = Plan(t, route, {}, flags, flags, argv, argv)
        aid = self._begin(p, None, "restart", mode)
        self.step(aid, "reason", reason)
        try:
            route.switch(self, aid, p, flags, {})
        except (ServerStartError, ApplyError) as exc:
            line = route.why_failed(self, t, exc)
            self.step(aid, "start_failed", line)
            jr.finish(
                self.engine,
                aid,
                ApplyOutcome.FAILED,
                f"restarted ({reason}), but it did not come back: {line}; the "
                "supervisor starts it again (managed.max_restarts)",
                now=self.clock(),
            )
            return jr.get_apply(self.engine, aid)
        jr.finish(self.engine, aid, ApplyOutcome.KEPT, f"restarted with the same flags: {reason}", now=self.clock())
        return jr.get_apply(self.engine, aid)

    def _busy(self, t: Target, *, shadow: bool = True) -> list[int]:
        """Open applies on ``t`` or on any replica of its group (a rolling apply holds them all); ``shadow=False``
        leaves out tuning runs beside production (they do not touch it)."""
        return [a for m in self.cfg.group(t) for a in jr.open_applies_for(self.engine, m.name, shadow=shadow)]

    def _begin(self, p: Plan, rec_id: int | None, kind: str, mode: str) -> int:
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
        _take(self.engine, aid)
        return aid

    def release(self, aid: int) -> None:
        """This thread is done with entry ``aid`` (finished, or left for a reconcile)."""
        _drop(self.engine, aid)

    def step(self, aid: int, name: str, detail: str = "", state: ApplyState | None = None) -> None:
        detail = self.cfg.redact(detail)  # a step's argv is shown (journal, API): its credentials are not
        jr.step(self.engine, aid, name, detail, now=self.clock(), state=state)
        self.say(f"[apply #{aid}] {name}" + (f": {detail}" if detail else ""))

    def _members(self, t: Target, start: float, end: float, group: bool) -> list[str]:
        """The targets whose data make up ``t``'s in [start, end]: itself, or its group's replicas that served then."""
        return route_for(t).replicas(self, t, start, end) if group else [t.name]

    def _profile(self, t: Target, start: float, end: float, *, group: bool = False) -> LoadProfile | None:
        """What ``t`` served in [start, end]; with ``group``, what its whole replica group served (every replica
        must have been scraped)."""
        return self._served(t, self._members(t, start, end, group), start, end)

    def _served(self, t: Target, names: list[str], start: float, end: float) -> LoadProfile | None:
        """What the targets ``names`` (``t`` or replicas of its group) served in [start, end], together."""
        scraped = self.store.target_names()
        if not names or any(n not in scraped for n in names):
            return None  # never scraped (no `tuner run` yet): nothing to judge with
        if len(names) == 1:
            return profile(self.store.window(names[0], start, end), slo=t.slo)
        return group_profile(t.group or t.name, [self.store.window(n, start, end) for n in names], slo=t.slo)

    def _kpis(self, t: Target, start: float, end: float, *, group: bool = False) -> dict[str, Any]:
        """The window's load profile for the journal, with the window itself so the verdict can read it again."""
        names = self._members(t, start, end, group)
        prof = self._served(t, names, start, end)
        scope = {"group": t.group, "replicas": names} if group and t.group else {}
        return {"window": [start, end], **scope, **(prof.summary() if prof else {})}

    def _kpis_of(self, t: Target, names: list[str], start: float, end: float) -> dict[str, Any]:
        """The journal's KPIs of a canary's or a control's targets over one window."""
        prof = self._served(t, names, start, end)
        return {
            "window": [start, end],
            **({"replicas": names} if names != [t.name] else {}),
            **(prof.summary() if prof else {}),
        }

    def judge_windows(
        self, t: Target, before: tuple[float, float], after: tuple[float, float], *, group: bool = False
    ) -> Verdict:
        """The verdict on two windows of a target's stored data (what `tuner judge TARGET` prints); with
        ``group``, of its whole replica group's (a rolling apply changes every replica: the group is judged)."""
        return judge(
            self._profile(t, *before, group=group),
            self._profile(t, *after, group=group),
            min_requests=t.apply.min_requests,
        )

    def _carry_out(self, aid: int, p: Plan, rec_id: int | None, *, rollback_of: int | None = None) -> jr.StoredApply:
        t = p.target
        now = self.clock()
        base = self._kpis(t, now - t.apply.baseline.total_seconds(), now, group=p.whole_group)
        if p.route.restarts and rollback_of is None:
            base["in_flight_at_drain"] = p.route.in_flight(self, t)  # None: not read, or no answer in time
        jr.set_kpis(self.engine, aid, now=now, baseline=base)
        self.step(aid, "baseline", json.dumps(base, default=str))
        try:
            p.route.switch(self, aid, p, p.new_flags, p.diff)
        except (ServerStartError, ApplyError) as exc:
            return self._switch_failed(aid, p, rec_id, exc, mark=rollback_of is None)
        if rollback_of is not None:
            note = f"restored the flags from before apply #{rollback_of}"
            jr.finish(self.engine, aid, ApplyOutcome.ROLLED_BACK, note, now=self.clock())
            if rec_id is not None:
                recs.set_status(
                    self.engine, rec_id, RecStatus.ROLLED_BACK, now=self.clock(), note=f"tuner rollback {t.name}"
                )
            return jr.get_apply(self.engine, aid)
        return self._observe_and_judge(aid, p, rec_id, base)

    def _observe(
        self, aid: int, t: Target, what: str, verdict: Callable[[float, float], Verdict]
    ) -> tuple[str | None, Verdict | None, float, float]:
        """Watch ``t`` for apply.observe, and on (up to observe_max, else 3x) while ``verdict(t0, now)`` is
        inconclusive: (the server's error line if it died meanwhile, the last verdict, t0, now)."""
        observe_s = t.apply.observe.total_seconds()
        limit_s = t.apply.observe_max.total_seconds() if t.apply.observe_max else 3 * observe_s
        self.step(
            aid,
            "observing",
            f"{what}{observe_s:g}s (up to {limit_s:g}s while inconclusive)",
            state=ApplyState.OBSERVING,
        )
        t0 = self.clock()
        v: Verdict | None = None
        while True:
            died = self._watch(t, min(observe_s, t0 + limit_s - self.clock()))
            now = self.clock()
            if died:
                return died, v, t0, now
            v = verdict(t0, now)
            if v.outcome != ApplyOutcome.INCONCLUSIVE or now - t0 >= limit_s - 0.5:
                return None, v, t0, now
            self.step(aid, "observing", f"inconclusive after {now - t0:.0f}s ({v.reason}); observing on")

    def _observe_and_judge(
        self, aid: int, p: Plan, rec_id: int | None, base: dict[str, Any], prefix: str = ""
    ) -> jr.StoredApply:
        t = p.target

        def verdict(t0: float, now: float) -> Verdict:
            before = tuple(base.get("window") or (t0 - t.apply.baseline.total_seconds(), t0))
            return self.judge_windows(t, (float(before[0]), float(before[1])), (t0, now), group=p.whole_group)

        died, v, t0, now = self._observe(
            aid, t, f"the replicas of {t.group} together, " if p.whole_group else "", verdict
        )
        after = self._kpis(t, t0, now, group=p.whole_group)
        if p.route.outage:
            after.update(self._cost(jr.get_apply(self.engine, aid), base))
        jr.set_kpis(self.engine, aid, now=now, after=after)
        if died or v is None:
            outcome, reason = ApplyOutcome.ROLLED_BACK, f"the server died while observed: {died}"
        else:
            outcome, reason = v.outcome, f"{v.reason} (confidence {v.confidence:.2f}; {v.test})"
        if v is not None and v.slo is not None:
            self.step(aid, "slo", v.slo.line())  # the SLO line first, before the verdict it led
        self.step(aid, "verdict", f"{outcome}: {reason}")
        if outcome == ApplyOutcome.KEPT or (outcome == ApplyOutcome.INCONCLUSIVE and t.apply.on_inconclusive == "keep"):
            if outcome == ApplyOutcome.INCONCLUSIVE:
                reason += "; the new flags stay (apply.on_inconclusive: keep)"
            jr.finish(self.engine, aid, outcome, prefix + reason, now=self.clock())
            if rec_id is not None:
                recs.set_status(self.engine, rec_id, "applied", now=self.clock(), note=prefix + reason)
            self.expire_stale(t, aid)
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
            self.step(aid, "restore_by_hand", " ".join(flags_argv(t.backend, p.old_flags)))
            # no data judges nothing: an inconclusive verdict stays inconclusive, never a failure
            jr.finish(
                self.engine,
                aid,
                ApplyOutcome.INCONCLUSIVE if outcome == ApplyOutcome.INCONCLUSIVE else ApplyOutcome.FAILED,
                note,
                now=self.clock(),
            )
        else:
            restored = self._restore(aid, p)
            jr.finish(self.engine, aid, outcome, f"{prefix}{reason}; {restored}", now=self.clock())
        if rec_id is not None:
            recs.set_status(self.engine, rec_id, RecStatus.ROLLED_BACK, now=self.clock(), note=prefix + reason)
        return jr.get_apply(self.engine, aid)

    def in_flight(self, t: Target) -> int | None:
        """Requests running or waiting on the server now, from one scrape of its /metrics (None: no answer).

        A loaded vLLM CPU answers /metrics in 4-10 s (its HTTP server shares cores with the engine), so this one
        read waits longer than a scrape does; the server keeps serving meanwhile."""
        try:
            snap = scrape_target(
                t, self.cfg, now=self.clock(), timeout_s=max(_IN_FLIGHT_TIMEOUT_S, self.cfg.timeout(t).total_seconds())
            )
        except TunerError:
            return None
        return round(sum((e.requests_running or 0.0) + (e.requests_waiting or 0.0) for e in snap.engines))

    @classmethod
    def _cost(cls, a: jr.StoredApply, base: dict[str, Any]) -> dict[str, Any]:
        """What the apply cost the clients, as far as the server side shows it (the journal's ``after``).

        ``outage_s``: drain start -> health gate passed, no new request served. ``arrivals_during_outage``: the
        baseline's offered load times the outage, an estimate of the requests that reached a server that was not
        serving: refused, or sent again by clients that retry; which of the two, only the clients (or a load
        balancer in front) can tell. The baseline holds ``in_flight_at_drain``, read from the server's /metrics
        just before the drain: vLLM finishes those within --shutdown-timeout, llama-server is drained idle first.
        """
        out: dict[str, Any] = {}
        outage = cls._outage(a)
        if outage is not None:
            out["outage_s"] = round(outage, 1)
            offered = base.get("offered_rps")
            if isinstance(offered, (int, float)):
                out["arrivals_during_outage"] = round(offered * outage, 1)
        return out

    @staticmethod
    def _outage(a: jr.StoredApply) -> float | None:
        """Seconds from the start of the drain until the new server passed its health gate."""
        ts: dict[str, int] = {}
        for st in a.steps:
            ts.setdefault(st["step"], st["ts_ms"])
        if "draining" in ts and "healthy" in ts and ts["healthy"] >= ts["draining"]:
            return (ts["healthy"] - ts["draining"]) / 1000
        return None

    def expected_outage(self, t: Target) -> tuple[float, int] | None:
        """(median outage in seconds, how many earlier applies it is from) for this target, if any."""
        seen = sorted(
            o for a in jr.list_applies(self.engine, target=t.name, limit=50) if (o := self._outage(a)) is not None
        )
        return (seen[len(seen) // 2], len(seen)) if seen else None

    def _watch(self, t: Target, seconds: float) -> str | None:
        """Sleep through the observation; the server's error line if a managed server dies meanwhile."""
        deadline = self.clock() + seconds
        while self.clock() < deadline:
            if t.managed is not None and self.running(t) is None:
                return mg.error_line(mg.log_path(t, self.config_dir))
            self.sleep(min(_OBSERVE_POLL_S, max(0.0, deadline - self.clock())))
        return None

    def _restore(self, aid: int, p: Plan) -> Restored:
        """Back to the old flags; whether that failed, and a description for the note."""
        t = p.target
        self.step(aid, "restoring", json.dumps(p.old_argv), state=ApplyState.STARTING)
        try:
            if not p.route.restore(self, aid, p):
                return Restored(False, "restore it by hand")
        except (ServerStartError, ApplyError) as exc:
            first = str(exc).splitlines()[0]
            self.step(aid, "restore_failed", first)
            if t.managed is not None:
                self.save_managed(t, None, p.old_flags, ServerState.CRASHED, note=first)
            return Restored(True, f"restoring the previous flags FAILED too: {first}")
        self.step(aid, "restored", "previous flags, healthy")
        return Restored(False, "previous flags restored and healthy")

    # ---- by hand ---------------------------------------------------------------------------------

    def _await_manual(self, aid: int, p: Plan, rec_id: int) -> jr.StoredApply:
        t = p.target
        text = (
            f"tuner does not manage {t.name} and it has no apply hook: restart it by hand with "
            f"{' '.join(flags_argv(t.backend, p.diff))} (all tunable flags: {' '.join(p.new_argv)}); then run "
            f"`tuner apply-recommendation {rec_id} --applied` and tuner health-checks and observes it "
            f"(or --cancel)"
        )
        self.step(aid, "awaiting_manual", text, state=ApplyState.AWAITING_MANUAL)
        now = self.clock()
        base = self._kpis(t, now - t.apply.baseline.total_seconds(), now)
        jr.set_kpis(self.engine, aid, now=now, baseline=base)
        return jr.get_apply(self.engine, aid)

    def manual_done(self, rec_id: int, *, cancel: bool = False) -> jr.StoredApply:
        a = next(
            (
                a
                for a in jr.open_applies(self.engine)
                if a.recommendation_id == rec_id and a.state == ApplyState.AWAITING_MANUAL
            ),
            None,
        )
        if a is None:
            raise ApplyError(f"recommendation #{rec_id} has no apply waiting for a restart by hand")
        t = self.cfg.target(a.target)
        p = Plan(t, ROUTES["manual"], a.diff, a.old_flags, a.new_flags, a.old_argv, a.new_argv)
        if cancel:
            jr.finish(self.engine, a.id, ApplyOutcome.FAILED, "cancelled before it was applied", now=self.clock())
            return jr.get_apply(self.engine, a.id)
        if not _take(self.engine, a.id):
            raise ApplyError(f"apply #{a.id} is being finished already (a second --applied)")
        try:
            if not jr.claim(
                self.engine, a, self.owner, "applied_by_hand", "", now=self.clock(), state=ApplyState.HEALTH_CHECK
            ):
                raise ApplyError(
                    f"apply #{a.id} was taken over meanwhile (a second --applied or --cancel); see "
                    f"`tuner journal {a.target}`"
                )
            try:
                self.step(a.id, "healthy", mg.health_gate(t))
            except ServerStartError as exc:
                jr.finish(
                    self.engine,
                    a.id,
                    ApplyOutcome.FAILED,
                    f"the server does not pass the health gate: {exc}; restart it "
                    f"by hand with {' '.join(flags_argv(t.backend, a.old_flags))}",
                    now=self.clock(),
                )
                recs.set_status(self.engine, rec_id, RecStatus.FAILED, now=self.clock(), note=str(exc))
                return jr.get_apply(self.engine, a.id)
            return self._observe_and_judge(a.id, p, rec_id, a.baseline)
        finally:
            _drop(self.engine, a.id)

    # ---- crash safety ------------------------------------------------------------------------------

    def reconcile(self, *, only: Callable[[jr.StoredApply], bool] | None = None) -> list[str]:
        """Finish or roll back every apply whose tuner died (those ``only`` accepts, when given); what was done, one
        line each.

        Each is claimed first, by compare-and-set on the owner and state read (jr.claim), and within this process by
        taking its id: of two reconcilers at once (`tuner run` starting while `tuner reconcile` runs, or two auto
        steps) one restores it and the other leaves it alone."""
        done: list[str] = []
        for a in jr.open_applies(self.engine):
            if a.state == ApplyState.AWAITING_MANUAL or (only is not None and not only(a)):
                continue
            if (a.owner_pid, a.owner_start) != self.owner and mg.is_alive(a.owner_pid, a.owner_start):
                continue  # another live tuner is doing it
            if not _take(self.engine, a.id):
                continue  # a thread of this process is doing it
            try:
                if jr.claim(
                    self.engine,
                    a,
                    self.owner,
                    "reconcile",
                    f"tuner pid {a.owner_pid} stopped at step {a.state}",
                    now=self.clock(),
                ):
                    done.append(self._reconcile_one(a))
                # else: another tuner claimed it first
            finally:
                _drop(self.engine, a.id)
        return done

    def _reconcile_one(self, a: jr.StoredApply) -> str:
        now = self.clock()
        if a.kind == "tune" and a.mode == "shadow":  # its trials ran beside production: nothing to put back
            jr.finish(
                self.engine,
                a.id,
                ApplyOutcome.ROLLED_BACK,
                "reconciled: the tuner of this tuning run stopped; its trials "
                "ran beside production, which was not touched",
                now=now,
            )
            return self._line(jr.get_apply(self.engine, a.id))
        try:
            t = self.cfg.target(a.target)
        except Exception:  # noqa: BLE001  (UnknownTargetError: the config no longer has it)
            jr.finish(self.engine, a.id, ApplyOutcome.FAILED, "reconciled: the target is no longer configured", now=now)
            return f"apply #{a.id}: target {a.target} no longer configured; closed as failed"
        p = Plan(t, route_for(t), a.diff, a.old_flags, a.new_flags, a.old_argv, a.new_argv)
        try:
            p.route.settle(self, a.id, t)
        except ApplyError as exc:
            self.step(a.id, "settle_failed", str(exc).splitlines()[0])
        found, healthy = "unknown", False
        if t.managed is not None:
            st = jr.get_managed(self.engine, t.name)
            r = self.running(t)
            if r is None:  # killed between starting a server and recording it: find it by its argv
                for candidate in (a.new_argv, a.old_argv):
                    pid = mg.find_by_argv(candidate)
                    if pid is not None:
                        r = mg.Running(pid, mg.proc_start_time(pid) or 0, candidate, mg.log_path(t, self.config_dir))
                        self.save_managed(
                            t, r, a.new_flags if candidate == a.new_argv else a.old_flags, ServerState.RUNNING
                        )
                        break
            argv = mg.proc_argv(r.pid) if r else None
            found = (
                "no server running"
                if r is None
                else (
                    "the new flags" if argv == a.new_argv else "the old flags" if argv == a.old_argv else "other flags"
                )
            )
            if r is not None:
                try:  # a server still starting (tuner died during the health check) gets its full start time
                    mg.wait_healthy(r, t.url, t.managed.start_timeout.total_seconds())
                    mg.health_gate(t, timeout_s=30)
                    healthy = True
                except ServerStartError:
                    healthy = False
            del st
        where = f"tuner died at step {a.state}; server found with {found}" + (
            " and healthy" if healthy else "" if found == "no server running" else " but not healthy"
        )
        self.step(a.id, "reconcile_found", where)
        if a.kind == "restart" and healthy:  # old and new flags are the same: it is running again, done
            jr.finish(self.engine, a.id, ApplyOutcome.KEPT, f"reconciled: {where}", now=self.clock())
            return self._line(jr.get_apply(self.engine, a.id))
        if found == "the new flags" and healthy and a.kind == "apply":
            self.say(f"apply #{a.id}: {where}: observing again")
            return self._line(
                self._observe_and_judge(a.id, p, a.recommendation_id, a.baseline, prefix="reconciled: " + where + "; ")
            )
        if found == "the old flags" and healthy:
            jr.finish(
                self.engine,
                a.id,
                ApplyOutcome.ROLLED_BACK,
                f"reconciled: {where}; nothing was changed",
                now=self.clock(),
            )
            return self._line(jr.get_apply(self.engine, a.id))
        restored = self._restore(a.id, p)
        outcome = ApplyOutcome.FAILED if restored.failed else ApplyOutcome.ROLLED_BACK
        jr.finish(self.engine, a.id, outcome, f"reconciled: {where}; {restored}", now=self.clock())
        if a.recommendation_id is not None and a.kind == "apply":
            recs.set_status(
                self.engine,
                a.recommendation_id,
                RecStatus.ROLLED_BACK,
                now=self.clock(),
                note=f"reconciled after tuner died: {where}",
            )
        return self._line(jr.get_apply(self.engine, a.id))

    @staticmethod
    def _line(a: jr.StoredApply) -> str:
        return f"apply #{a.id} {a.target}: {a.outcome}: {a.note}"
