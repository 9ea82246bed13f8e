"""The daemon's scrapes: one target's /metrics (and /health when due), or a fleet's series read from Prometheus in
one query, each result counted for tuner's /metrics and handed to the store's writer; a failure is recorded with
its error, never raised. daemon/jobs.py schedules them (the scrape loop for direct targets, one job per interval
for the fleet) and hands this a new config when Kubernetes pods come and go."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tuner.collect.http import Peers
from tuner.collect.layout import Layouts
from tuner.collect.promsource import scrape_fleet
from tuner.collect.scrape import scrape_target
from tuner.collect.snapshots import TargetSnapshot
from tuner.config import Config, Target
from tuner.daemon.state import DaemonState
from tuner.daemon.writer import StoreWriter
from tuner.errors import ExpositionError, ScrapeError
from tuner.store.store import Failed, Scraped

__all__ = ["ScrapeJobs"]

log = logging.getLogger("tuner.daemon")


class ScrapeJobs:
    def __init__(self, cfg: Config, state: DaemonState, writer: StoreWriter, *, clock: Callable[[], float]) -> None:
        self.cfg = cfg
        self.state = state
        self.writer = writer
        self.clock = clock
        self.layouts = Layouts()  # each target's last exposition shape: a scrape of the same shape skips parsing
        self.peers = Peers()  # each target's connection, kept alive from one scrape to the next
        self._health_asked: dict[str, float] = {}  # target -> when its /health last answered 200 (clock())

    def scrape_once(self, target: Target) -> bool:
        """Scrape one target and store the result (at the next flush while the daemon runs: one transaction a
        tick for every target); False (and a recorded error) when the scrape failed."""
        now = self.clock()
        start = time.monotonic()
        asked = self._health_due(target, now)
        try:
            got: TargetSnapshot | Exception = scrape_target(
                target, self.cfg, now=now, layouts=self.layouts, peers=self.peers, health=asked
            )
        except Exception as exc:  # recorded as the target's failure (a bug too: it must not kill the job)
            got = exc
        if isinstance(got, Exception) or (asked and got.healthy is not True):  # ask again at the next scrape
            self._health_asked.pop(target.name, None)
        elif asked:
            self._health_asked[target.name] = now
        return self._record(target, got, now, time.monotonic() - start)

    def _health_due(self, target: Target, now: float) -> bool:
        """Whether this scrape asks vLLM's /health: at most every ``health_interval`` while it answers 200, at
        every scrape after anything else (so a failing engine is seen at every scrape, and its recovery too)."""
        last = self._health_asked.get(target.name)
        return last is None or not 0 <= now - last < self.cfg.health_interval(target).total_seconds()

    def scrape_fleet_once(self, targets: list[Target]) -> int:
        """Read every target of one interval whose source is Prometheus in one query per backend (collect/
        promsource.scrape_fleet) and store each one's result; how many were read."""
        now = self.clock()
        start = time.monotonic()
        assert self.cfg.prometheus is not None  # the config validator guarantees it
        timeout = max(self.cfg.timeout(t).total_seconds() for t in targets)
        try:
            got: dict[str, TargetSnapshot | Exception] = dict(
                scrape_fleet(self.cfg.prometheus.url, targets, timeout_s=timeout, now=now)
            )
        except Exception as exc:  # Prometheus unreachable (or a bug): every target failed alike
            got = {t.name: exc for t in targets}
        took = time.monotonic() - start
        return sum(self._record(t, got[t.name], now, took) for t in targets)

    def _record(self, target: Target, got: TargetSnapshot | Exception, now: float, took: float) -> bool:
        if isinstance(got, (ScrapeError, ExpositionError)):
            log.warning("scrape %s: %s", target.name, got)
            error = str(got)
        elif isinstance(got, Exception):
            log.error("scrape of %s failed unexpectedly", target.name, exc_info=got)
            error = f"internal error: {got!r}"
        else:
            self._count(target.name, ok=True, duration=got.duration_s)
            return self.writer.keep(Scraped(got, target.url, target.labels))
        self._count(target.name, ok=False, duration=took)
        self.writer.keep(
            Failed(
                target.name,
                target.backend,
                target.url,
                now,
                took,
                error,
                target.labels,
                healthy=got.healthy if isinstance(got, ScrapeError) else None,
            )
        )
        return False

    def _count(self, name: str, *, ok: bool, duration: float) -> None:
        with self.state.lock:
            self.state.scrapes_total[name] = self.state.scrapes_total.get(name, 0) + 1
            if not ok:
                self.state.scrape_failures_total[name] = self.state.scrape_failures_total.get(name, 0) + 1
            self.state.last_duration_s[name] = duration
