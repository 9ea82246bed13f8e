"""The daemon's apply side: applies a previous tuner left half done (at start), managed servers kept running and
restarted when stalled, auto mode's steps, and the apply half of tuner's /metrics with tuner's own series for the
rules over its own loop. Each job records its failures in the daemon's state and returns; daemon/jobs.py schedules
them. The alert rules read two of its answers: a vLLM target's max-num-seqs in force and the signals that come from
tuner's own state (``max_num_seqs``, ``target_signal``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from tuner.app.auto import auto_step
from tuner.app.selfwatch import SelfSeries
from tuner.app.signalbook import SignalBook
from tuner.app.stall import STALL_WINDOW_S, StallWatch, stall_step
from tuner.apply.flow import Applier
from tuner.apply.guard import Decision, applies_last_hour, flag_flips, halted
from tuner.config import Config, Target, replica_groups
from tuner.daemon.state import DaemonState
from tuner.errors import TunerError
from tuner.flags import takes
from tuner.signals.selfwatch import self_signal
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store.alerts import outbox_size
from tuner.store.journal import ApplyState
from tuner.store.store import Store

__all__ = ["ApplyJobs"]

log = logging.getLogger("tuner.daemon")


class ApplyJobs:
    def __init__(
        self,
        cfg: Config,
        store: Store,
        state: DaemonState,
        applier: Applier,
        signals: SignalBook,
        own: SelfSeries,
        *,
        clock: Callable[[], float],
        job_error: Callable[[str, str], None],
    ) -> None:
        self.cfg = cfg  # the daemon's, replaced with it when pods come and go
        self.store = store
        self.state = state
        self.applier = applier
        self.signals = signals
        self.own = own
        self.clock = clock
        self.job_error = job_error
        self.applied: set[str] = jr.targets_with_applies(store.engine)  # targets the journal has applies of
        self.stall_watch = StallWatch()  # managed targets with restart_when_stalled: since when each has been stalled

    def reconcile_once(self) -> None:
        """Finish or roll back applies a previous tuner left half done (runs once at start)."""
        try:
            for line in self.applier.reconcile():
                log.warning("reconcile: %s", line)
        except TunerError as exc:
            self.job_error("reconcile", str(exc))

    def manage_once(self, target: Target) -> None:
        """Keep a managed server running: start it, or restart it after a crash (bounded)."""
        try:
            what = self.applier.servers.supervise(target)
        except TunerError as exc:
            self.job_error(f"manage:{target.name}", str(exc))
            return
        except Exception as exc:  # a bug must not kill the supervisor
            log.exception("supervising %s failed", target.name)
            self.job_error(f"manage:{target.name}", f"internal error: {exc!r}")
            return
        with self.state.lock:
            self.state.job_errors.pop(f"manage:{target.name}", None)
        if what:
            log.warning("%s", what)
        if target.managed is not None and target.managed.restart_when_stalled is not None:
            self.restart_if_stalled(target)

    def restart_if_stalled(self, target: Target) -> None:
        """managed.restart_when_stalled: restart the server once its engine has been stalled that long (journaled)."""
        now = self.clock()
        try:
            sig = self.signals.get(target.name, STALL_WINDOW_S, now)
            a = stall_step(self.applier, target, sig, now=now, watch=self.stall_watch)
        except TunerError as exc:  # the guardrails refused it (restart budget, an apply open): said, tried again later
            self.job_error(f"restart:{target.name}", str(exc))
            return
        with self.state.lock:
            self.state.job_errors.pop(f"restart:{target.name}", None)
        if a is not None:
            self.applied.add(target.name)
            log.warning("%s: apply #%d restart %s: %s", target.name, a.id, a.outcome, a.note)

    def auto_once(self, target: Target) -> None:
        """Auto mode: refresh the target's recommendations, then apply the best one if the guardrails allow."""

        def decided(d: Decision) -> None:
            with self.state.lock:
                self.state.auto_decision[target.name] = d.reason
                self.state.auto_halted[target.name] = d.halted
                self.state.auto_alive[target.name] = self.clock()  # an evaluation: the loop is alive
            log.log(
                logging.WARNING if d.go else logging.INFO,
                "auto %s: %s%s",
                target.name,
                "applying " if d.go else "not now: ",
                d.reason,
            )

        try:
            a = auto_step(self.cfg, self.store, self.applier, target, now=self.clock(), decided=decided).applied
            with self.state.lock:
                self.state.auto_alive[target.name] = self.clock()
            if a is None:
                return
            self.applied.add(target.name)
            log.warning("auto %s: apply #%d %s: %s", target.name, a.id, a.outcome, a.note)
        except TunerError as exc:
            self.job_error(f"auto:{target.name}", str(exc))
        except Exception as exc:  # noqa: BLE001
            log.exception("auto mode for %s failed", target.name)
            self.job_error(f"auto:{target.name}", f"internal error: {exc!r}")

    def status_once(self) -> None:
        """Refresh the apply side of /metrics from the store (counts only: cheap)."""

        try:
            counts: dict[tuple[str, str], int] = {}
            for r in recs.list_recommendations(self.store.engine):
                counts[(r.target, r.status)] = counts.get((r.target, r.status), 0) + 1
            applies = jr.outcome_counts(self.store.engine)
            self.applied = jr.targets_with_applies(self.store.engine)
            now = self.clock()
            stopped = {t.name: self.is_halted(t, now) for t in self.cfg.targets if t.apply.mode == "auto"}
            up = {t.name: self.applier.running(t) is not None for t in self.cfg.targets if t.managed}
            limits = {t.name: v for t in self.cfg.targets if (v := self.max_num_seqs(t)) is not None}
            journal = {name: jr.list_applies(self.store.engine, target=name, limit=200) for name in self.applied}
            busy_auto = {
                t.name
                for t in self.cfg.targets
                if t.apply.mode == "auto"
                and t.name in self.applied
                and any(a.state != ApplyState.DONE for a in journal.get(t.name, ()))
            }
            queued = outbox_size(self.store)
            for group, members in replica_groups(self.cfg.targets).items():  # a group's: its replicas' together
                if all(m.name in limits for m in members):
                    limits[group] = sum(limits[m.name] for m in members)
        except TunerError as exc:
            self.job_error("apply-status", str(exc))
            return
        with self.state.lock:
            self.state.recommendations, self.state.applies = counts, applies
            self.state.auto_halted.update(stopped)
            self.state.managed_up = up
            self.state.max_num_seqs = limits
            self.state.applies_last_hour = {n: applies_last_hour(h, now) for n, h in journal.items()}
            self.state.flag_flips = {n: flag_flips(h, now) for n, h in journal.items()}
            for name in busy_auto:  # auto mode is running an apply: busy, not stalled
                self.state.auto_alive[name] = now
        self._record_own(now, queued)

    def _record_own(self, now: float, queued: int) -> None:
        """tuner's own series at this tick, for the rules over its own loop (app/selfwatch.py)."""
        ts = int(now * 1000)
        with self.state.lock:
            failures = dict(self.state.scrape_failures_total)
            thrash = dict(self.state.applies_last_hour)
            flips = dict(self.state.flag_flips)
            alive = dict(self.state.auto_alive)
        for t in self.cfg.targets:
            self.own.record("tuner_scrape_failures_total", t.name, ts, failures.get(t.name, 0))
            if t.name in thrash:
                self.own.record("tuner_applies_last_hour", t.name, ts, thrash[t.name])
                self.own.record("tuner_apply_flag_flips", t.name, ts, flips.get(t.name, 0))
            if t.name in alive:
                self.own.record("tuner_auto_last_evaluation_timestamp_seconds", t.name, ts, alive[t.name])
                self.own.record("tuner_auto_interval_seconds", t.name, ts, self.auto_every(t))
        self.own.record("tuner_alert_notifications_queued", "", ts, queued)

    def max_num_seqs(self, target: Target) -> float | None:
        """The max-num-seqs a vLLM target runs with: the flags in force (managed, or after an apply), not the
        config's raw key (which a managed target, a snake_case config or a kept apply leaves stale)."""
        if not takes(target.backend, "max_num_seqs"):  # llama-server has --parallel instead
            return None
        # The journal is read only for targets it has applies of (refreshed every 5 s, and at once after auto mode's
        # own applies): 1,000 targets' alert rules would otherwise query it 1,000 times an evaluation.
        value = self.applier.flags_in_force(target, journaled=target.name in self.applied).get("max_num_seqs")
        return float(value) if value is not None else None

    def auto_every(self, t: Target) -> float:
        """How often auto mode evaluates the target: its auto_interval, at least one scrape interval."""
        return max(t.apply.auto_interval.total_seconds(), self.cfg.interval(t).total_seconds())

    def target_signal(self, name: str, signal_name: str, window: timedelta = timedelta(minutes=5)) -> float | None:
        """Signals that come from tuner's own state rather than from scrapes (for alert rules): the journal's
        auto_apply_halted read now, the others from tuner's own series (app/selfwatch.py) as their exported twins
        read them. ``name`` "" for a tuner signal."""
        if signal_name == "auto_apply_halted":
            t = self.state.targets.get(name)
            if t is None or t.apply.mode != "auto":
                return None
            return 1.0 if self.is_halted(t, self.clock()) else 0.0
        return self_signal(signal_name, name, window.total_seconds(), int(self.clock() * 1000), self.own.points)

    def is_halted(self, t: Target, now: float) -> bool:
        return halted(
            jr.list_applies(self.store.engine, target=t.name, limit=50), now, t.apply.max_consecutive_rollbacks
        )
