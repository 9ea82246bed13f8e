"""The daemon's alerting loop: read signals from the store, evaluate rules, persist state, queue and send.

tuner/rules is pure; this is where its inputs are read and its outputs written. Alert state is
restored from the store at start (pending timers keep running across a restart), and each
evaluation writes the new state, its history events and the notifications due in one transaction.
A rule reload that fails keeps the last good rule set.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta

from tuner.app.status import group_signals_at
from tuner.config import Config, Target, replica_groups
from tuner.errors import TunerError
from tuner.notify import FlushResult, Notifier
from tuner.rules.evaluate import configured_max_num_seqs, payload, reads_by_window
from tuner.rules.group import Inputs, eval_group
from tuner.rules.model import RuleGroup, RuleSet, default_rule_files, load_rule_files
from tuner.rules.state import Alert, AlertState, from_row, to_row
from tuner.signals.derive import TargetSignals, compute_signals
from tuner.store.alerts import load_states, save_states
from tuner.store.store import Store

__all__ = ["Alerting"]

log = logging.getLogger("tuner.alerting")


class Alerting:
    def __init__(
        self,
        cfg: Config,
        store: Store,
        *,
        clock: Callable[[], float],
        target_signal: Callable[[str, str, timedelta], float | None] | None = None,
        max_num_seqs: Callable[[Target], float | None] | None = None,
        signals: Callable[..., TargetSignals | None] | None = None,
    ) -> None:
        self.cfg, self.store, self.clock = cfg, store, clock
        # (target, window seconds, now, windows=the group's other windows) -> signals: the daemon's SignalBook (once
        # per tick, one read of the store per target for all the group's windows), else derived here
        self.signals_for = signals or self._derive
        self.target_signal = target_signal  # tuner's own signals (journal, counters, outbox), from the daemon
        self.max_num_seqs = max_num_seqs or configured_max_num_seqs  # the daemon's: the flags in force
        self.files = cfg.alerting.rule_files or default_rule_files()
        self.rules: RuleSet = load_rule_files(self.files, cfg.alerting.evaluation_interval)
        self.lock = threading.Lock()
        self.state: dict[str, dict[str, Alert]] = {}
        for (key, fp), row in load_states(store).items():
            self.state.setdefault(key, {})[fp] = from_row(row)
        # What the store holds, as of the last write that went through: an evaluation writes only the differences.
        # evaluate() never modifies the alerts it is given (it works on copies), so these stay as written.
        self._stored: dict[tuple[str, str], Alert] = {
            (a.rule, a.fingerprint): a for alerts in self.state.values() for a in alerts.values()
        }
        self.notifier = Notifier(store)
        self.base_url = (cfg.alerting.external_url or cfg.listen_url).rstrip("/")
        self.last_error = ""

    def _derive(self, name: str, window_s: float, now: float, **_: object) -> TargetSignals | None:
        return compute_signals(self.store.window(name, now - window_s, now), slo=self.cfg.target(name).slo)

    def reload(self) -> bool:
        """Re-read the rule files; on any error keep the current set and return False."""
        try:
            rules = load_rule_files(self.files, self.cfg.alerting.evaluation_interval)
        except TunerError as exc:  # the caller logs it (one line naming the file)
            self.last_error = f"rule reload failed, keeping the last good rules: {exc}"
            return False
        with self.lock:
            self.rules = rules
            keys = {g.key(r) for g in rules.groups for r in g.rules}
            self.state = {k: v for k, v in self.state.items() if k in keys}
        self.last_error = ""
        return True

    def evaluate_group(self, group: RuleGroup) -> dict[str, str]:
        """Evaluate every rule of ``group`` at now (tuner/rules/group.py, the evaluation the scenario runner runs too)
        and write the outcome; a rule that fails to evaluate (a bug, a value no rule expects) is left as it was and
        reported, and the others are evaluated as usual (Prometheus keeps a rule's health the same way). Returns the
        failed rules' errors by key (group/alert)."""
        now = self.clock()
        now_ms = int(now * 1000)
        cache: dict[tuple[str, timedelta], TargetSignals | None] = {}
        # What every group of this interval reads (they run in the same ticks): the first group to ask for a
        # target derives the windows and fields of all of them from one read, and the others find them in the
        # book, instead of each deriving its own and the next one deriving the shared windows again for the fields
        # it adds (bench/results/). Windows no rule reads a target's signals over are not derived.
        peers = [r for g in self.rules.groups if g.interval == group.interval for r in g.rules]
        fields = reads_by_window(peers)
        windows = set(fields)
        replica_sets = replica_groups(self.cfg.targets) if any(r.over == "groups" for r in group.rules) else {}

        def signals(name: str, window: timedelta) -> TargetSignals | None:
            if (name, window) not in cache:
                try:
                    if name in replica_sets:  # a rule over groups: the replicas' windows together
                        cache[(name, window)] = group_signals_at(
                            self.store, self.cfg, name, window_s=window.total_seconds(), at=now
                        )
                    else:
                        cache[(name, window)] = self.signals_for(
                            name, window.total_seconds(), now, windows=windows, fields=fields
                        )
                except TunerError:
                    cache[(name, window)] = None  # never scraped yet: no data, no alert
            return cache[(name, window)]

        gpus = self.store.gpu_latest(max_age_s=max(60.0, 3 * self.cfg.gpu.interval.total_seconds()), now=now)
        inputs = Inputs(
            self.cfg.targets, signals, gpus, target_signal=self.target_signal, max_num_seqs=self.max_num_seqs
        )
        with self.lock:
            out = eval_group(group, self.state, now_ms, inputs, resend_delay=self.cfg.alerting.resend_delay)
            self.state.update(out.state)
            events = out.events
            outgoing = [payload(a, f"{self.base_url}/metrics#alert={key}") for key, a in out.due]
            batches = [(am, outgoing) for am in self.cfg.alerting.alertmanagers] if outgoing else []
            self._save(events, batches, now_ms)
        for e in events:
            log.info("alert %s %s -> %s (%s)", e["rule"], e["from_state"], e["to_state"], e["labels"])
        return out.failed

    def _save(self, events: list[dict], outbox: list[tuple[str, list[dict]]], now_ms: int) -> None:
        """Persist the alert set (what changed since the last write), the events and the notifications due."""
        now = {(a.rule, a.fingerprint): a for alerts in self.state.values() for a in alerts.values()}
        stored = self._stored
        changed = [to_row(a) for k, a in now.items() if stored.get(k) != a]
        gone = [k for k in stored if k not in now]
        save_states(self.store, changed, gone, events=events, outbox=outbox, now_ms=now_ms)
        self._stored = now  # written (a failed write raised: the next one writes the differences from before)

    def flush(self) -> FlushResult:
        return self.notifier.flush(int(self.clock() * 1000))

    def active(self) -> list[Alert]:
        with self.lock:
            return [a for alerts in self.state.values() for a in alerts.values() if a.state != AlertState.INACTIVE]
