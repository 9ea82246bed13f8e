"""``tuner run``: scrape every target on its own interval, read the GPUs, keep signals fresh, prune old data.

Every job catches its own failures and records them: one bad target never stops the others.
Direct scrapes run on the daemon's own ScrapeLoop (daemon/scrapeloop.py: no overlapping scrapes of one target, a
late scrape runs once, not in a burst, timed by the monotonic clock); everything else is an APScheduler job with
``max_instances=1`` and ``coalesce``.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from tuner.app.alerting import Alerting
from tuner.app.memory import EngineMemory, memory_of, server_pids
from tuner.app.selfwatch import SelfSeries, keep_for
from tuner.app.session import Session
from tuner.app.signalbook import SignalBook
from tuner.app.status import group_signals_at
from tuner.collect.gpu import GpuCollector
from tuner.config import Config, Target, replica_groups
from tuner.daemon.applying import ApplyJobs
from tuner.daemon.evaluating import RuleJobs
from tuner.daemon.malloc import ARENAS, collect_less, limit_arenas
from tuner.daemon.metrics import serve_metrics
from tuner.daemon.rlimit import raise_open_files
from tuner.daemon.scrapeloop import ScrapeLoop
from tuner.daemon.scraping import ScrapeJobs
from tuner.daemon.state import DaemonState
from tuner.daemon.writer import StoreWriter
from tuner.errors import StoreError, TunerError
from tuner.kube import Discovery, templates
from tuner.names import VLLM_KV_CACHE_USAGE_PERC
from tuner.rules.evaluate import RESOLVED_RETENTION
from tuner.store.db import daemon_lock, incremental_vacuum, redact_url
from tuner.store.retention import apply_retention
from tuner.store.store import GpuLatest, Store

__all__ = ["Daemon", "serve_daemon", "RedactSecrets"]

log = logging.getLogger("tuner.daemon")

SIGNAL_POLL_S = 0.2  # the longest a SIGHUP or SIGTERM waits for its handler (run_forever)
_CLOCK_STEP_S = 2.0  # a wall-clock jump larger than this (against the monotonic clock) is a step, not drift
_SIGNALS_COST_S = 0.015  # one target's window + derive over a full 5-minute window (bench/results/)


class Daemon:
    def __init__(
        self, cfg: Config, store: Store, *, clock: Callable[[], float] = time.time, config_dir: Path | None = None
    ) -> None:
        self.state = DaemonState()
        # Kubernetes: each template's pods in its place, followed as they come and go (_retarget)
        self.discovery: Discovery | None = None
        self._retarget_lock = threading.Lock()
        self._following = False  # pods changes are followed once the daemon is built (start)
        if templates(cfg):
            self.discovery = Discovery(
                cfg,
                config_dir,
                changed=self._pods_changed,
                failed=lambda name, error: self._discover_error(name, error),
                clock=clock,
            )
            cfg = self.discovery.first()
        self.cfg = cfg
        self.store = store
        self.clock = clock
        self.writer = StoreWriter(store, self.state, self._job_error)
        self.gpu = GpuCollector(
            cfg.gpu.source,
            cfg.gpu.url,
            timeout_s=cfg.defaults.scrape_timeout.total_seconds(),
            max_body_bytes=cfg.defaults.max_body_bytes,
        )
        self._stop = threading.Event()
        self.scraping = ScrapeJobs(cfg, self.state, self.writer, clock=clock)
        self.scheduler: BackgroundScheduler | None = None
        self.scrape_loop: ScrapeLoop[str] | None = None
        self._direct: dict[str, Target] = {}  # what the scrape loop scrapes, by name (pods come and go)
        self._origin = time.monotonic()  # the scrape schedule's origin (its first round)
        self._step = 1.0  # the first scraped target's interval: a round of scrapes starts every _step from _origin
        self._settle_s = 0.0  # how long an evaluation may wait for the scrapes due before it to land
        for t in cfg.targets:
            store.ensure_target(t.name, t.backend, t.url, t.labels)
        self.state.targets = {t.name: t for t in cfg.targets}
        self.signals = SignalBook(cfg, store)
        # Invalid rule files stop the daemon here: it never runs with a half-loaded rule set.
        self.alerting = self.state.alerting = Alerting(
            cfg,
            store,
            clock=clock,
            target_signal=lambda *a: self.applying.target_signal(*a),
            max_num_seqs=lambda t: self.applying.max_num_seqs(t),
            signals=self.signals.get,
        )
        self.session = Session(cfg, (config_dir or Path.cwd()).resolve(), store)
        self.applier = self.session.applier(say=log.info, clock=clock)
        self.own = SelfSeries(keep_for(self.alerting.rules))  # tuner's own series, for the rules over its own loop
        self.rules = RuleJobs(self.alerting, self.state, self.own, job_error=self._job_error, landed=self._landed)
        self.applying = ApplyJobs(
            cfg, store, self.state, self.applier, self.signals, self.own, clock=clock, job_error=self._job_error
        )
        started = clock()
        self.state.auto_alive = {t.name: started for t in cfg.targets if t.apply.mode == "auto"}
        self.state.auto_every = {t.name: self.applying.auto_every(t) for t in cfg.targets if t.apply.mode == "auto"}

    # ---- jobs: each one records its failures and returns ----------------------------------------

    def _scrape_direct(self, name: str) -> None:
        t = self._direct.get(name)
        if t is not None:  # None: a pod gone while its scrape was due
            self.scraping.scrape_once(t)

    def _scrape_fleet_every(self, every: timedelta) -> int:
        """The fleet job of one interval when pods come and go: the targets read from Prometheus now."""
        targets = [t for t in self.cfg.targets if t.source == "prometheus" and self.cfg.interval(t) == every]
        return self.scraping.scrape_fleet_once(targets) if targets else 0

    # ---- Kubernetes pods: targets that come and go -------------------------------------------------

    def _discover_error(self, template: str, error: str) -> None:
        if error:
            self._job_error(f"discover:{template}", error)
        else:
            with self.state.lock:
                self.state.job_errors.pop(f"discover:{template}", None)

    def _pods_changed(self) -> None:
        assert self.discovery is not None
        with self._retarget_lock:
            if self._following and not self._stop.is_set():
                self._retarget(self.discovery.current())

    def _retarget(self, cfg: Config) -> None:
        """The targets are now ``cfg``'s (pods came or went): a new one is scraped from its first interval on, a
        gone one is scraped no more; the store keeps what was scraped of it (a verdict reads it)."""
        old = {t.name: t for t in self.cfg.targets}
        new = {t.name: t for t in cfg.targets}
        for name in new.keys() - old.keys():
            t = new[name]
            self.store.ensure_target(t.name, t.backend, t.url, t.labels)
        self.cfg = self.scraping.cfg = self.signals.cfg = self.alerting.cfg = self.session.cfg = cfg
        self.applier.cfg = self.applying.cfg = cfg
        gone = old.keys() - new.keys()
        with self.state.lock:
            self.state.targets = dict(new)
            for name in gone:
                for kept in (
                    self.state.signals,
                    self.state.scrapes_total,
                    self.state.scrape_failures_total,
                    self.state.last_duration_s,
                ):
                    kept.pop(name, None)  # tuner's /metrics shows the targets it has; the store their history
        for name, t in new.items():
            if t.source != "prometheus":
                added = name not in self._direct
                self._direct[name] = t
                if added and self.scrape_loop is not None:
                    self.scrape_loop.add(name, self.cfg.interval(t).total_seconds())
        for name in gone:
            if self._direct.pop(name, None) is not None and self.scrape_loop is not None:
                self.scrape_loop.remove(name)
        if gone or new.keys() - old.keys():
            log.info(
                "targets: %d (+%s, -%s)",
                len(new),
                ",".join(sorted(new.keys() - old.keys())) or "0",
                ",".join(sorted(gone)) or "0",
            )

    def _job_error(self, job: str, error: str) -> None:
        log.error("%s: %s", job, error)
        with self.state.lock:
            self.state.job_errors[job] = error

    def gpu_once(self) -> None:
        try:
            reading = self.gpu.read(self.clock())
        except TunerError as exc:  # a dcgm-exporter that is down or serves garbage
            self._job_error("gpu", str(exc))
            return
        with self.state.lock:
            self.state.job_errors.pop("gpu", None)
            self.state.gpu = reading
        try:
            self.store.ingest_gpu(reading)
        except StoreError as exc:
            self._job_error("gpu", str(exc))

    def signals_once(self) -> None:
        """Every target's signals over the configured window, for /metrics and status (from the SignalBook:
        derived once per tick, shared with the alert rules over the same window), and each replica group's."""
        now = self.clock()
        window = self.cfg.defaults.signal_window.total_seconds()
        gpus = self.store.gpu_latest(max_age_s=max(60.0, 3 * self.cfg.gpu.interval.total_seconds()), now=now)
        for t in self.cfg.targets:
            try:
                sig = self.signals.get(t.name, window, now)
                memory = self._memory(t, now, gpus) if sig is not None and t.backend == "vllm" else None
            except TunerError as exc:
                self._job_error(f"signals:{t.name}", str(exc))
                continue
            if sig is None:  # never scraped yet
                continue
            with self.state.lock:
                self.state.signals[t.name] = sig
                if memory is not None:
                    self.state.memory[t.name] = memory
        for group in replica_groups(self.cfg.targets):  # what each group's replicas served together (engine "all")
            try:
                gsig = group_signals_at(self.store, self.cfg, group, window_s=window, at=now)
            except TunerError as exc:
                self._job_error(f"signals:{group}", str(exc))
                continue
            if gsig is not None:
                with self.state.lock:
                    self.state.signals[group] = gsig

    def _memory(self, t: Target, now: float, gpus: list[GpuLatest]) -> list[EngineMemory]:
        """Where the target's memory goes (app/memory.py), from its newest scrapes: the KV use and the engine config
        its last few scrapes stored."""
        recent = self.store.window(
            t.name, now - 3 * self.cfg.interval(t).total_seconds(), now, metrics=frozenset([VLLM_KV_CACHE_USAGE_PERC])
        )
        return memory_of(
            t,
            recent,
            gpus,
            pids=server_pids(self.store.engine, t),
            flags=self.applier.flags_in_force(t, journaled=t.name in self.applying.applied),
        )

    def _landed(self, at_most_s: float) -> None:
        """Before an evaluation: the scrapes due by now landed (they were handed out just before it; waiting at most
        ``at_most_s``), and the writer flushed them into the store, not a quarter second on."""
        if self.scrape_loop is not None:
            self.scrape_loop.settle(time.monotonic(), min(self._settle_s, at_most_s))
        self.writer.flush()

    # ---- apply side: managed servers, auto mode, crash recovery ----------------------------------

    def retention_once(self) -> None:
        # A notification older than this says nothing Alertmanager still needs: its firing alerts' endsAt has
        # passed (ValidUntil, 4 x the resend delay) and a resolved one is resent for RESOLVED_RETENTION at most.
        longest = max((g.interval for g in self.alerting.rules.groups), default=self.cfg.alerting.evaluation_interval)
        outbox_age = max(RESOLVED_RETENTION, 4 * max(self.cfg.alerting.resend_delay, longest))
        try:
            done = apply_retention(self.store, self.cfg.store.retention, now=self.clock(), outbox_max_age=outbox_age)
        except StoreError as exc:
            self._job_error("retention", str(exc))
            return
        with self.state.lock:
            self.state.job_errors.pop("retention", None)
        if done.get("dropped_outbox"):
            log.warning(
                "retention: dropped %d notification(s) older than %s that no Alertmanager accepted",
                done["dropped_outbox"],
                outbox_age,
            )

    # ---- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        if limit_arenas():  # before the worker threads: each would take a malloc arena of its own (daemon/malloc.py)
            log.debug("malloc: at most %d arenas", ARENAS)
        files, warning = raise_open_files(len(self.cfg.targets))  # one kept connection per target (daemon/rlimit.py)
        if warning:
            log.warning("%s", warning)
        log.debug("open files: at most %d", files)
        apply_jobs = sum((t.managed is not None) + (t.apply.mode == "auto") for t in self.cfg.targets)
        # + signals, rules groups, gpu, fleet reads, notify, reconcile, apply-status, retention
        workers = max(4, len(self.alerting.rules.groups) + 8) + apply_jobs
        sched = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(workers)},
            job_defaults={"max_instances": 1, "coalesce": True},
            timezone=timezone.utc,
        )
        now = datetime.now(timezone.utc)
        self._origin = time.monotonic()  # the scrapes' schedule and the rules' (RuleJobs.start) from here
        direct = self._direct = {t.name: t for t in self.cfg.targets if t.source != "prometheus"}
        self._step = next((self.cfg.interval(t).total_seconds() for t in direct.values()), 1.0)
        self._settle_s = max((self.cfg.timeout(t).total_seconds() for t in direct.values()), default=0.0)
        # First scrapes spread over the interval, so many targets do not fire at once.
        self.scrape_loop = ScrapeLoop(
            list(direct),
            lambda name: self.cfg.interval(direct[name]).total_seconds(),
            self._scrape_direct,
            workers=max(4, min(32, len(direct) + 2)),
            start=self._origin,
        )
        fleets: dict[timedelta, list[Target]] = defaultdict(list)  # read from Prometheus: one job per interval
        for t in self.cfg.targets:
            if t.source == "prometheus":
                fleets[self.cfg.interval(t)].append(t)
        for t in self.discovery.prom_side if self.discovery is not None else []:
            fleets.setdefault(self.cfg.interval(t), [])  # its pods join the job of their interval as they come
        for every, targets in fleets.items():
            # with pods coming and going, each run reads the targets of its interval then
            job, args = (
                (self.scraping.scrape_fleet_once, [targets])
                if self.discovery is None
                else (self._scrape_fleet_every, [every])
            )
            sched.add_job(
                job,
                IntervalTrigger(seconds=every.total_seconds()),
                args=args,
                id=f"scrape-prometheus:{every.total_seconds():g}s",
                next_run_time=now,
                misfire_grace_time=int(every.total_seconds()) or 1,
            )
        if self.discovery is not None and self.discovery.prom_side:
            every_s = min(self.cfg.interval(t).total_seconds() for t in self.discovery.prom_side)
            sched.add_job(
                self.discovery.poll_prometheus,
                IntervalTrigger(seconds=max(every_s, 5.0)),
                id="pods",
                next_run_time=now + timedelta(seconds=max(every_s, 5.0)),
            )
        if self.cfg.gpu.source != "none":
            sched.add_job(
                self.gpu_once,
                IntervalTrigger(seconds=self.cfg.gpu.interval.total_seconds()),
                id="gpu",
                next_run_time=now,
            )
        step = min((self.cfg.interval(t) for t in self.cfg.targets), default=timedelta(seconds=5))
        # Re-reading a target's window and deriving its signals costs ~10-20 ms (bench/results/): with many
        # targets refresh less often, so this job stays near a fifth of one core and never starves the scrapes
        # (100 targets: every 7.5 s; 1,000: every 75 s). Alert rules read the store directly, not this cache.
        signals_every = max(1.0, step.total_seconds(), len(self.cfg.targets) * _SIGNALS_COST_S / 0.2)
        sched.add_job(self.signals_once, IntervalTrigger(seconds=signals_every), id="signals", next_run_time=now + step)
        sched.add_job(self.applying.reconcile_once, id="reconcile", next_run_time=now)  # once, before any apply job
        for t in self.cfg.targets:
            if t.managed is not None:
                sched.add_job(
                    self.applying.manage_once,
                    IntervalTrigger(seconds=5),
                    args=[t],
                    id=f"manage:{t.name}",
                    next_run_time=now + timedelta(seconds=1),
                )
            if t.apply.mode == "auto":
                auto_s = self.applying.auto_every(t)
                sched.add_job(
                    self.applying.auto_once,
                    IntervalTrigger(seconds=auto_s),
                    args=[t],
                    id=f"auto:{t.name}",
                    next_run_time=now + timedelta(seconds=auto_s),
                )
        sched.add_job(self.applying.status_once, IntervalTrigger(seconds=5), id="apply-status", next_run_time=now)
        sched.add_job(
            self.retention_once, IntervalTrigger(minutes=10), id="retention", next_run_time=now + timedelta(seconds=30)
        )
        if self.cfg.alerting.alertmanagers:
            sched.add_job(self.rules.notify_once, IntervalTrigger(seconds=1), id="notify", next_run_time=now)
        self.writer.start(self._stop)
        self.scrape_loop.start()
        if self.discovery is not None:
            with self._retarget_lock:
                self._following = True
                self._retarget(self.discovery.current())  # what changed since the first list
            self.discovery.start()
        self.rules.start(self._origin, self._step)
        sched.start()
        self.scheduler = sched
        threading.Thread(target=self._watch_clock, name="clock-watch", daemon=True).start()

    def _watch_clock(self) -> None:
        """APScheduler times its jobs by the wall clock: after the clock steps back an hour it would wait that
        hour before the next signals refresh or notification (scrapes and rule evaluations are on the monotonic
        clock). Measured against the monotonic clock, a step back reschedules every job stranded in the future to
        run now (a step forward needs nothing: late jobs run once, coalesced)."""
        skew = time.time() - time.monotonic()
        while not self._stop.wait(1.0):
            step, skew = time.time() - time.monotonic() - skew, time.time() - time.monotonic()
            if step > -_CLOCK_STEP_S or self.scheduler is None:
                continue
            log.warning("wall clock stepped back %.0f s; rescheduling jobs from now", -step)
            now = datetime.now(timezone.utc)
            for job in self.scheduler.get_jobs():
                every = getattr(job.trigger, "interval", None)
                if every is not None and job.next_run_time is not None and job.next_run_time > now + every:
                    try:
                        job.modify(next_run_time=now)
                    except Exception as exc:  # removed meanwhile (a rules reload): nothing to reschedule
                        log.debug("reschedule %s: %r", job.id, exc)

    def stop(self) -> None:
        self._stop.set()
        if self.discovery is not None:
            self.discovery.stop()

    def _wait(self, max_seconds: float | None) -> None:
        """Until stop() (or ``max_seconds``), waking every SIGNAL_POLL_S: a signal the kernel hands to another thread
        only marks Python's handler due, and the main thread runs it the next time it runs Python code. A wait with
        no timeout never does: under load about one SIGHUP (or SIGTERM) in four then waited for the next signal
        (tests/daemon/test_signals.py; found by bench/soak.py)."""
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        while True:
            left = SIGNAL_POLL_S if deadline is None else min(SIGNAL_POLL_S, deadline - time.monotonic())
            if left <= 0 or self._stop.wait(left):
                return

    def run_forever(self, *, install_signal_handlers: bool = True, max_seconds: float | None = None) -> None:
        """Run until SIGTERM/SIGINT (or ``max_seconds``); in-flight scrapes finish before returning."""
        if install_signal_handlers:
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())
            signal.signal(signal.SIGHUP, lambda *_: self.rules.reload())
        self.start()
        try:
            self._wait(max_seconds)
        finally:
            self._stop.set()  # max_seconds ran out: the writer and the clock watch stop too
            if self.discovery is not None:
                self.discovery.stop()
            assert self.scheduler is not None and self.scrape_loop is not None
            self.scrape_loop.stop(wait=True)
            self.rules.stop()
            self.scheduler.shutdown(wait=True)
            self.writer.join()  # and what the last scrapes queued
            self.scraping.peers.close()
            log.info("stopped")


class RedactSecrets(logging.Filter):
    """A log handler's filter: every record's text with the config's credentials as *** (Config.redact): an argv, a
    server's log tail or an apply's note may quote one, from any logger."""

    def __init__(self, redact: Callable[[str], str]) -> None:
        super().__init__()
        self.redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        hidden = self.redact(text)
        if hidden != text:
            record.msg, record.args = hidden, ()
        return True


def serve_daemon(session: Session, *, max_seconds: float | None, log: logging.Logger = log) -> int:
    """`tuner run`: the daemon and its listener (/metrics, /api/v1) until SIGTERM/SIGINT or ``max_seconds``."""
    cfg = session.cfg
    if cfg.secrets or any(t.managed and t.managed.extra_args for t in cfg.targets):
        for handler in logging.getLogger().handlers:
            handler.addFilter(RedactSecrets(cfg.redact))
    with daemon_lock(session.store.engine):  # one daemon per store: a second one exits here, naming the first
        started = time.monotonic()
        if incremental_vacuum(session.store.engine):  # once, for a store made before; no scrape is written meanwhile
            log.warning(
                "store %s converted to incremental vacuum in %.1f s (retention now gives freed space back)",
                redact_url(cfg.store.url),
                time.monotonic() - started,
            )
        daemon = Daemon(cfg, session.store, config_dir=session.config_dir)
        host, port = cfg.listen_host_port
        server, _thread = serve_metrics(
            daemon.state, host, port, daemon=daemon, token=cfg.api.token(session.config_dir)
        )
        log.info(
            "tuner %d target(s); own metrics on %s/metrics; store %s",
            len(cfg.targets),
            cfg.listen_url,
            redact_url(cfg.store.url),
        )
        collect_less()  # the daemon is built: its objects out of the collector's sight (daemon/malloc.py)
        try:
            daemon.run_forever(max_seconds=max_seconds)
        finally:
            server.shutdown()  # type: ignore[attr-defined]
    return 0
