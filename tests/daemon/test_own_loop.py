"""The rules over tuner's own loop, fed by the daemon: its own series recorded at each apply-status tick and read
through the same arithmetic as their exported twins (signals/selfwatch.py). Time moves by an injected clock."""

from __future__ import annotations

from datetime import timedelta

from tuner.config import parse_config
from tuner.daemon import Daemon


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_scrape_errors_auto_evaluations_missed_and_the_outbox_reach_the_rules(store):
    clock = Clock(1_800_000_000.0)
    cfg = parse_config(
        "targets:\n  - {name: gone, backend: vllm, url: 'http://127.0.0.1:9', "
        "apply: {mode: auto, auto_interval: 30s}}\n"
    )
    daemon = Daemon(cfg, store, clock=clock)
    start = clock.t
    for _ in range(41):  # a refused target, scraped every 15 s for 10 minutes; nothing ever evaluates auto mode
        daemon.scraping.scrape_once(cfg.targets[0])
        daemon.applying.status_once()
        clock.t += 15
    clock.t -= 15
    five = timedelta(minutes=5)
    # every one of 4 a minute failed
    assert daemon.applying.target_signal("gone", "scrape_errors_per_minute", five) == 4.0
    assert daemon.applying.target_signal("", "all_scrape_errors_per_minute", five) == 4.0
    assert daemon.applying.target_signal("gone", "auto_evaluations_missed", five) == (clock.t - start) / 30
    assert daemon.applying.target_signal("", "notifications_queued_growth", timedelta(minutes=10)) == 0.0
    assert daemon.applying.target_signal("gone", "applies_per_hour", five) is None  # no apply on record: no series

    group = next(g for g in daemon.alerting.rules.groups if g.name == "tuner-self")
    daemon.alerting.evaluate_group(group)
    active = {(a.labels["alertname"], a.state) for a in daemon.alerting.active()}
    assert ("ScrapeErrorsHigh", "pending") in active and ("AutoLoopStalled", "pending") in active
    assert ("ScrapeErrorsHighOverall", "pending") not in active  # 4 a minute is under its 10
