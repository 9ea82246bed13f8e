"""The daemon against real local HTTP servers: every kind of bad target is recorded, the good one keeps being stored."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import text

from tests.helpers import Route, fixture_text, serve
from tuner.config import parse_config
from tuner.daemon import Daemon
from tuner.lab.proc import wait_for
from tuner.lab.replay import ReplayExposition, ReplayServer

VLLM_FIXTURE = "vllm-0.32-cpu/metrics_after_load.txt"
FIFTY_MB = 50 * 2**20


def _bad_routes() -> dict[str, dict[str, Route]]:
    good = fixture_text(VLLM_FIXTURE)
    lines = good.splitlines()
    running = next(i for i, line in enumerate(lines) if line.startswith("vllm:num_requests_running{"))
    malformed = "\n".join(lines[:running] + ['vllm:num_requests_running{engine="0" 3'] + lines[running + 1 :])
    nan = good.replace(lines[running], lines[running].rsplit(" ", 1)[0] + " NaN")
    dup = good + lines[running] + "\n"
    untyped = "\n".join(line for line in lines if not line.startswith("#"))
    health = {"/health": Route(body=b"")}
    return {
        "malformed": {"/metrics": Route(body=malformed), **health},
        "nan": {"/metrics": Route(body=nan), **health},
        "duplicate": {"/metrics": Route(body=dup), **health},
        "untyped": {"/metrics": Route(body=untyped), **health},
        "huge": {"/metrics": Route(stream=lambda: (b"#" * 65536 for _ in range(FIFTY_MB // 65536)))},
        "hangs": {"/metrics": Route(delay_s=30)},
        "http500": {"/metrics": Route(status=500, body=b"engine dead")},
        "garbage": {"/metrics": Route(body=b"\x00\x01<html>not metrics</html>")},
    }


EXPECT = {  # target -> (health, a fragment of the recorded error)
    "malformed": ("down", "line "),
    "nan": ("degraded", "NaN; sample dropped"),
    "duplicate": ("down", "duplicate series"),
    "untyped": ("degraded", "has no TYPE"),
    "huge": ("down", "max_body_bytes"),
    "hangs": ("down", "no complete answer"),
    "http500": ("down", "HTTP 500"),
    "garbage": ("down", "line 1"),
    "refused": ("down", "connection refused"),
}


def _config(tmp_path: Path, urls: dict[str, str], interval: str = "1s") -> str:
    targets = "\n".join(f"  - {{name: {n}, backend: vllm, url: '{u}'}}" for n, u in urls.items())
    return (
        f"store: {{url: 'sqlite:///{tmp_path}/tuner.db'}}\nlisten: 127.0.0.1:0\n"
        f"defaults: {{scrape_interval: {interval}, scrape_timeout: 1s, max_body_bytes: 5MiB}}\n"
        f"targets:\n{targets}\n"
    )


def test_every_bad_target_is_recorded_and_the_good_one_still_stored(tmp_path, store):
    from contextlib import ExitStack

    with ExitStack() as stack:
        urls = {"good": stack.enter_context(ReplayServer(ReplayExposition(fixture_text(VLLM_FIXTURE)))).url}
        for name, routes in _bad_routes().items():
            urls[name] = stack.enter_context(serve(routes))
        urls["refused"] = "http://127.0.0.1:9"  # discard port: nothing listens
        cfg = parse_config(_config(tmp_path, urls))
        daemon = Daemon(cfg, store)
        results = {t.name: daemon.scraping.scrape_once(t) for t in cfg.targets}
        assert results["good"] is True

        for name, (health, fragment) in EXPECT.items():
            h = store.health(name)
            assert h is not None, name
            assert h.health == health, (name, h)
            assert fragment in h.last_error, (name, h.last_error)
        # degraded scrapes keep what was valid: the NaN one lost only the bad sample
        with store.engine.connect() as conn:
            stored = dict(
                conn.execute(
                    text(
                        "SELECT t.name, COUNT(*) FROM samples s JOIN series r ON r.id = s.series_id "
                        "JOIN targets t ON t.id = r.target_id GROUP BY t.name"
                    )
                ).all()
            )
        assert stored["nan"] == stored["good"] - 1
        assert stored["untyped"] == stored["good"]
        assert "malformed" not in stored and "huge" not in stored

        # Now on the scheduler: the good target keeps being scraped while the others fail.
        daemon.run_forever(install_signal_handlers=False, max_seconds=3.5)
        with store.engine.connect() as conn:
            per_target = dict(
                conn.execute(
                    text("SELECT t.name, COUNT(*) FROM scrapes s JOIN targets t ON t.id = s.target_id GROUP BY t.name")
                ).all()
            )
        assert per_target["good"] >= 3
        assert daemon.state.scrape_failures_total.get("good", 0) == 0
        assert store.health("refused").consecutive_failures >= 3


def test_no_overlapping_scrapes_of_one_target(tmp_path, store):
    """A scrape job slower than its interval (e.g. a slow store write) never runs twice at once.

    The first scrape blocks until the scrape loop has come back for the same target three times and refused each;
    then it is released. Conditions, not wall time, move the test."""
    import threading

    release = threading.Event()

    from tuner.daemon.scraping import ScrapeJobs

    class SlowScrapes(ScrapeJobs):
        inflight = peak = runs = 0
        lock = threading.Lock()

        def scrape_once(self, target):
            with self.lock:
                SlowScrapes.inflight += 1
                SlowScrapes.runs += 1
                SlowScrapes.peak = max(SlowScrapes.peak, SlowScrapes.inflight)
            try:
                release.wait(30)
                return super().scrape_once(target)
            finally:
                with self.lock:
                    SlowScrapes.inflight -= 1

    with ReplayServer(ReplayExposition(fixture_text(VLLM_FIXTURE))) as server:
        cfg = parse_config(_config(tmp_path, {"slow": server.url}, interval="200ms"))
        daemon = Daemon(cfg, store)
        daemon.scraping = SlowScrapes(cfg, daemon.state, daemon.writer, clock=daemon.clock)
        runner = threading.Thread(target=daemon.run_forever, kwargs={"install_signal_handlers": False})
        runner.start()
        try:
            wait_for(
                lambda: daemon.scrape_loop is not None and daemon.scrape_loop.refused >= 3,
                30,
                "the scrape loop to come back three times for the busy target",
            )
            assert SlowScrapes.runs == 1  # three due runs came and went while the first was in flight
        finally:
            release.set()
            daemon.stop()
            runner.join(30)
    assert SlowScrapes.peak == 1


def _run_tuner(config: Path, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "--config", str(config), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_outdated_schema_stops_run_with_the_fixing_command(tmp_path):
    config = tmp_path / "tuner.yaml"
    config.write_text(_config(tmp_path, {"a": "http://127.0.0.1:9"}))
    proc = _run_tuner(config, "run")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 5
    assert "tuner db upgrade" in err and "Traceback" not in err


def test_sigterm_stops_run_cleanly(tmp_path):
    with ReplayServer(ReplayExposition(fixture_text(VLLM_FIXTURE))) as server:
        config = tmp_path / "tuner.yaml"
        config.write_text(_config(tmp_path, {"good": server.url}, interval="500ms"))
        subprocess.run(
            [sys.executable, "-m", "tuner.cli", "--config", str(config), "db", "upgrade"],
            check=True,
            capture_output=True,
        )
        proc = _run_tuner(config, "run")
        deadline = time.monotonic() + 30
        while server_scrapes(server) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server_scrapes(server) >= 2, proc.stderr.read() if proc.poll() is not None else "no scrapes"
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert "stopped" in err


def test_one_daemon_per_store_a_second_run_exits_with_one_line_naming_the_first(tmp_path):
    """Two `tuner run` started together on one fresh store: one runs, the other exits at once with one line naming
    the pid that holds the store (before: both ran, and both alerted; or the second died on an IntegrityError
    traceback registering the same targets). When the first is gone, a new one starts."""
    config = tmp_path / "tuner.yaml"
    config.write_text(_config(tmp_path, {f"t{k}": "http://127.0.0.1:9" for k in range(20)}))
    subprocess.run(
        [sys.executable, "-m", "tuner.cli", "--config", str(config), "db", "upgrade"], check=True, capture_output=True
    )
    procs = [_run_tuner(config, "run") for _ in range(2)]
    try:
        wait_for(lambda: any(p.poll() is not None for p in procs), 60, "one of the two `tuner run` to exit")
        loser = next(p for p in procs if p.poll() is not None)
        winner = next(p for p in procs if p is not loser)
        _, err = loser.communicate(timeout=10)
        assert loser.returncode == 6 and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err
        assert f"held by another `tuner run` (pid {winner.pid};" in err and "tuner.db.daemon.lock" in err, err
        assert winner.poll() is None  # still running: the refusal did not touch it
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.communicate(timeout=30)
    again = _run_tuner(config, "run", "--for", "1s")
    _, err = again.communicate(timeout=60)
    assert again.returncode == 0, err  # the lock went with the process that held it


def server_scrapes(server: ReplayServer) -> int:
    return server.exposition.scrapes


def test_default_listen_is_loopback():
    assert parse_config("targets: []\n").listen_host_port == ("127.0.0.1", 9464)


def test_health_is_asked_every_health_interval_while_it_answers_200_and_every_scrape_after_anything_else(store):
    """vLLM's /health costs as much as /metrics per scrape: the daemon asks it at most every health_interval
    while it answers 200, and at every scrape once it does not (or a scrape failed) until it answers 200 again.
    What the store says of the target's health is the last answer, through the scrapes that did not ask; a
    target that is down has none."""
    body = fixture_text(VLLM_FIXTURE)
    routes = {"/metrics": Route(body=body), "/health": Route(body=b"")}
    with serve(routes) as url:
        cfg = parse_config(
            f"targets:\n  - {{name: v, backend: vllm, url: '{url}'}}\n"
            "defaults: {scrape_interval: 5s, scrape_timeout: 2s, health_interval: 15s}\n"
        )
        now = [1_800_000_000.0]
        daemon = Daemon(cfg, store, clock=lambda: now[0])
        seen = []

        def scrape(at: float, health_status: int | None = None, metrics_status: int = 200) -> None:
            if health_status is not None:
                routes["/health"].status = health_status
            routes["/metrics"].status = metrics_status
            now[0] = 1_800_000_000.0 + at
            before = routes["/health"].hits
            daemon.scraping.scrape_once(cfg.targets[0])
            h = store.health("v")
            seen.append((at, routes["/health"].hits - before, h.health, h.server_healthy))

        for at in (0, 5, 10, 15, 20):
            scrape(at)
        scrape(25, health_status=503)  # not asked: 10 s since the last 200
        scrape(30)  # asked: 503
        scrape(35)  # asked again at once
        scrape(40, health_status=200)  # recovered: seen at this scrape
        scrape(45)
        scrape(50, metrics_status=500)  # down: health unknown, asked again at the next scrape
        scrape(55, metrics_status=200)
        scrape(60)
    assert seen == [
        (0, 1, "up", True),
        (5, 0, "up", True),
        (10, 0, "up", True),
        (15, 1, "up", True),
        (20, 0, "up", True),
        (25, 0, "up", True),
        (30, 1, "up", False),
        (35, 1, "up", False),
        (40, 1, "up", True),
        (45, 0, "up", True),
        (50, 0, "down", None),
        (55, 1, "up", True),
        (60, 0, "up", True),
    ]


def test_health_interval_0s_asks_at_every_scrape(store):
    routes = {"/metrics": Route(body=fixture_text(VLLM_FIXTURE)), "/health": Route(body=b"")}
    with serve(routes) as url:
        cfg = parse_config(f"targets:\n  - {{name: v, backend: vllm, url: '{url}', health_interval: 0s}}\n")
        now = [1_800_000_000.0]
        daemon = Daemon(cfg, store, clock=lambda: now[0])
        for _ in range(4):
            now[0] += 5
            daemon.scraping.scrape_once(cfg.targets[0])
    assert routes["/health"].hits == routes["/metrics"].hits == 4


def test_an_evaluation_reads_the_scrape_due_with_it_the_moment_it_lands(tmp_path, store):
    """The rules are evaluated in phase with the scrapes, each evaluation first waiting for the scrapes due by then
    to land: an alert fires as soon as the scrape that saw its condition is stored. The scrape that sees the
    condition is slowed by 0.3 s, so it is still in flight when its round's evaluation is due. Half an interval out
    of phase (tuner before 2026-11-25) it fired 1 s after that scrape began; in phase without waiting, an evaluation
    read the store while the scrape was in flight and it fired a whole interval (2 s) after."""
    import threading

    line = 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} '
    text_ = fixture_text(VLLM_FIXTURE)
    assert line + "0.0\n" in text_
    metrics = Route(body=text_.replace(line + "0.0\n", line + "0.1\n"))
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n  - name: g\n    interval: 2s\n    rules:\n"
        "      - {alert: KVHigh, signal: kv_cache_usage, op: '>', threshold: 0.5, window: 1m, for: 0s}\n"
    )
    with serve({"/metrics": metrics, "/health": Route(body=b"")}) as url:
        cfg = parse_config(
            _config(tmp_path, {"chat": url}, interval="2s")
            + f"alerting: {{rule_files: ['{rules}'], evaluation_interval: 2s}}\n"
        )
        daemon = Daemon(cfg, store)
        runner = threading.Thread(target=daemon.run_forever, kwargs={"install_signal_handlers": False})
        runner.start()
        try:
            wait_for(lambda: metrics.hits >= 2, 30, "two scrapes of the calm server")
            metrics.finished.clear()
            assert metrics.finished.wait(30)  # a calm scrape was just answered: the next one is an interval away
            metrics.delay_s, metrics.body = 0.3, text_.replace(line + "0.0\n", line + "0.9\n")
            wait_for(
                lambda: (
                    _first(
                        store, "SELECT MIN(ts_ms) FROM alert_events WHERE rule LIKE '%KVHigh%' AND to_state = 'firing'"
                    )
                    is not None
                ),
                30,
                "KVHigh to fire",
            )
        finally:
            daemon.stop()
            runner.join(30)
    seen = _first(
        store,
        "SELECT MIN(s.ts_ms) FROM samples s JOIN series r ON r.id = s.series_id "
        "WHERE r.metric = 'vllm:kv_cache_usage_perc' AND s.value > 0.5",
    )
    fired = _first(store, "SELECT MIN(ts_ms) FROM alert_events WHERE rule LIKE '%KVHigh%' AND to_state = 'firing'")
    assert seen is not None and fired is not None
    assert 0.3 <= (fired - seen) / 1000 < 0.8, (seen, fired)  # after the slow scrape landed, and at once


def _first(store, sql: str):
    with store.engine.connect() as conn:
        return conn.execute(text(sql)).scalar()


_HIGH = (
    "groups:\n  - name: h\n    interval: 1s\n    rules:\n"
    "      - {alert: High, signal: kv_cache_usage, op: '>', threshold: 0.5, window: 1m, for: 0s}\n"
)


@contextmanager
def _running_with_rules(tmp_path, store, rules: Path):  # type: ignore[no-untyped-def]
    """A daemon running on ``rules`` (reloaded by the test, not by SIGHUP), scraping a vLLM whose KV use is 0.9."""
    line = 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} '
    metrics = Route(body=fixture_text(VLLM_FIXTURE).replace(line + "0.0\n", line + "0.9\n"))
    with serve({"/metrics": metrics, "/health": Route(body=b"")}) as url:
        cfg = parse_config(_config(tmp_path, {"chat": url}) + f"alerting: {{rule_files: ['{rules}']}}\n")
        daemon = Daemon(cfg, store)
        runner = threading.Thread(target=daemon.run_forever, kwargs={"install_signal_handlers": False})
        runner.start()
        try:
            yield daemon
        finally:
            daemon.stop()
            runner.join(30)


def _high_fired(store) -> bool:  # type: ignore[no-untyped-def]
    return bool(_first(store, "SELECT COUNT(*) FROM alert_events WHERE rule LIKE '%High%' AND to_state = 'firing'"))


def test_a_rules_reload_in_a_running_daemon_replaces_the_evaluation_loop(tmp_path, store):
    """SIGHUP's reload while the daemon runs: the old groups' loop stops, the new groups are evaluated on the
    scrapes' clock (here: a new group's rule fires on the served condition)."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n  - name: g\n    interval: 1s\n    rules:\n"
        "      - {alert: Low, signal: kv_cache_usage, op: '<', threshold: 0.5, window: 1m, for: 0s}\n"
    )
    with _running_with_rules(tmp_path, store, rules) as daemon:
        wait_for(lambda: daemon.rules.loop is not None, 30, "the rules' loop to start")
        old = daemon.rules.loop
        rules.write_text(_HIGH)
        assert daemon.rules.reload() is True
        assert daemon.rules.loop is not old and old is not None and old._stopping  # noqa: SLF001
        wait_for(lambda: _high_fired(store), 30, "the new group's alert to fire")
    assert not _first(store, "SELECT COUNT(*) FROM alert_events WHERE rule LIKE '%Low%'")


def test_a_daemon_started_with_no_rule_group_evaluates_the_groups_a_reload_brings(tmp_path, store):
    """A rule file with no group at the start (nothing to evaluate, so no loop), then a group added and reloaded:
    its rule is evaluated and fires. The reload used to restart the loop only if there was one, and the new group
    was never evaluated."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("groups: []\n")
    with _running_with_rules(tmp_path, store, rules) as daemon:
        wait_for(lambda: daemon.scheduler is not None, 30, "the daemon to start")
        assert daemon.rules.loop is None  # nothing to evaluate
        rules.write_text(_HIGH)
        assert daemon.rules.reload() is True
        wait_for(lambda: _high_fired(store), 30, "the reloaded group's alert to fire")
