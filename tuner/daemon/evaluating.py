"""The daemon's alert side: each rule group evaluated in phase with the scrapes on one loop (replaced by a reload),
each rule's failure a job error of its own, and what an evaluation queued sent to Alertmanager at once. The
evaluation itself is tuner/app/alerting.py's (the one group evaluation in tuner/rules/group.py, which `tuner
alerts test` calls too); daemon/jobs.py builds this and schedules the notifications' retries."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from tuner.app.alerting import Alerting
from tuner.app.selfwatch import SelfSeries, keep_for
from tuner.daemon.scrapeloop import ScrapeLoop
from tuner.daemon.state import DaemonState
from tuner.errors import TunerError
from tuner.rules.model import RuleGroup

__all__ = ["RuleJobs"]

log = logging.getLogger("tuner.daemon")

# An evaluation is due this long after a round of the first target's scrapes is handed out: time for the scrape loop
# to hand it out (the two schedules run on different threads), and settle() then waits for it to land.
_EVAL_AFTER_S = 0.005


class RuleJobs:
    def __init__(
        self,
        alerting: Alerting,
        state: DaemonState,
        own: SelfSeries,
        *,
        job_error: Callable[[str, str], None],
        landed: Callable[[float], None],
    ) -> None:
        """``landed(at_most_s)``: returns once the scrapes due by now are in the store (waiting at most that long)."""
        self.alerting = alerting
        self.state = state
        self.own = own
        self._job_error = job_error
        self._landed = landed
        self.loop: ScrapeLoop[str] | None = None  # the groups' evaluations (start; none while there is no group)
        self._phase: tuple[float, float] | None = None  # since start: the scrapes' origin and a round's length

    def evaluate_once(self, group_name: str) -> None:
        group = next((g for g in self.alerting.rules.groups if g.name == group_name), None)
        if group is None:  # removed by a reload; its job is being replaced
            return
        self._landed(group.interval.total_seconds() / 2)
        try:
            failed = self.alerting.evaluate_group(group)
        except TunerError as exc:
            self._job_error(f"rules:{group_name}", str(exc))
            return
        with self.state.lock:
            self.state.job_errors.pop(f"rules:{group_name}", None)
        self._rule_health(group, failed)
        if self.alerting.cfg.alerting.alertmanagers:  # the config as of now (pods come and go)
            self.notify_once()  # send what this evaluation queued now, as Prometheus does, not at the next tick

    def _rule_health(self, group: RuleGroup, failed: dict[str, str]) -> None:
        """Each rule's failure as a job error of its own (``rule:GROUP/ALERT`` on /metrics' tuner_job_error), logged
        when it starts or its error changes and when it recovers: once per kind of failure, not at every tick."""
        with self.state.lock:
            errors = self.state.job_errors
            said = []
            for rule in group.rules:
                job, error = f"rule:{group.key(rule)}", failed.get(group.key(rule))
                before = errors.get(job)
                if error is not None and error != before:
                    errors[job] = error
                    said.append((logging.ERROR, error))
                elif error is None and before is not None:
                    del errors[job]
                    said.append((logging.WARNING, f"rule {group.key(rule)} evaluates again"))
        for level, line in said:
            log.log(level, "%s", line)

    def notify_once(self) -> None:
        try:
            result = self.alerting.flush()
        except TunerError as exc:
            self._job_error("notify", str(exc))
            return
        with self.state.lock:
            for am, error in result.errors.items():
                self.state.job_errors[f"notify:{am}"] = error
            if result.sent and not result.errors:
                for key in [k for k in self.state.job_errors if k.startswith("notify:")]:
                    del self.state.job_errors[key]

    def reload(self) -> bool:
        """SIGHUP: re-read the rule files; on any failure keep the last good set and log one line naming it (the
        handler runs on the main thread: an exception escaping it would end the daemon)."""
        try:
            ok = self.alerting.reload()
        except Exception as exc:  # noqa: BLE001  a bug: reported, and the daemon keeps its rules and runs on
            self._job_error("rules", f"rule reload failed, keeping the last good rules: internal error: {exc!r}")
            return False
        if not ok:
            self._job_error("rules", self.alerting.last_error)
            return False
        self.own.keep_ms = int(keep_for(self.alerting.rules) * 1000)
        with self.state.lock:  # a new rule set: its groups and rules report afresh at their next evaluation
            for job in [j for j in self.state.job_errors if j == "rules" or j.startswith(("rules:", "rule:"))]:
                del self.state.job_errors[job]
        if self._phase is not None:  # started: the new groups on a loop of their own (a file that had none too)
            self.start(*self._phase)
        rules = self.alerting.rules
        log.info(
            "rules reloaded: %d groups, %d rules from %s",
            len(rules.groups),
            len(rules.rules),
            ", ".join(map(str, self.alerting.files)),
        )
        return True

    def start(self, origin: float, step: float) -> None:
        """Evaluate each alert group every ``interval``, in phase with the scrapes (a round every ``step`` seconds
        from ``origin``, monotonic): each evaluation is due just after a round of scrapes is handed out (its
        interval a multiple of the first target's: every round), and it first waits for the scrapes due by then to
        land (evaluate_once), so a condition is evaluated the moment its scrape is stored. Half an interval out of
        phase, as before 2026-11-25, every alert waited half an evaluation interval more for nothing
        (bench/results/, the alert latency runs); Prometheus's rules run at a phase of their own, on average as late.
        On APScheduler's wall clock the phase was not the scrapes' to keep. A group still evaluating when it is due
        again is not run twice; a late loop runs once and comes back in phase (ScrapeLoop). A reload replaces the
        loop."""
        self._phase = (origin, step)
        old, self.loop = self.loop, None
        if old is not None:
            old.stop(wait=False)
        groups = {g.name: g for g in self.alerting.rules.groups}
        if not groups:
            return
        # the first evaluation a round after now (at the start: after the first round, every target scraped once)
        rounds = max(1, math.ceil((time.monotonic() - origin) / step))
        self.loop = ScrapeLoop(
            list(groups),
            lambda name: groups[name].interval.total_seconds(),
            self.evaluate_once,
            workers=len(groups) + 1,
            spread=False,
            what="evaluation",
            start=origin + rounds * step + _EVAL_AFTER_S,
        )
        self.loop.start()

    def stop(self) -> None:
        """The evaluations stop; one in progress finishes first."""
        if self.loop is not None:
            self.loop.stop(wait=True)
