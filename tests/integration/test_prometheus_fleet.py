"""The fleet path: tuner reads many targets from a real Prometheus that scrapes them, in one query per backend.

The targets are recorded vLLM expositions served with counters advancing (tuner.lab.replay), so a dozen of
them cost nothing; Prometheus 2.42 is real and scrapes them every second.
"""

from __future__ import annotations

import time
import urllib.parse
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from tests.helpers import VLLM_DIR, migrated_store
from tuner.collect.promsource import scrape_fleet, scrape_via_prometheus
from tuner.config import parse_config
from tuner.daemon.jobs import Daemon
from tuner.errors import ScrapeError
from tuner.lab.replay import ReplayExposition, ReplayServer

N = 12


def _queries(prom_url: str) -> float:
    """How many instant queries Prometheus has answered, from its own /metrics."""
    body = urllib.request.urlopen(f"{prom_url}/metrics", timeout=5).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query"' in line
    )


def test_a_fleet_is_read_in_one_query_per_backend_and_split_as_each_target_alone_reads(
    prometheus_factory, tmp_path: Path
) -> None:
    text = (VLLM_DIR / "metrics_under_load.txt").read_text()
    with ExitStack() as stack:
        servers = [
            stack.enter_context(ReplayServer(ReplayExposition(text, growth=0.01 * (i + 1))))  # distinct counts
            for i in range(N + 1)
        ]
        hosts = [s.url.split("://")[1] for s in servers]
        prom = prometheus_factory([*hosts, "127.0.0.1:9"], interval_s=1.0)  # :9 (discard): nothing listens
        lines = [
            f"  - {{name: v{i}, backend: vllm, url: 'http://{h}', source: prometheus}}" for i, h in enumerate(hosts[:N])
        ]
        regex = hosts[N].replace(".", "\\\\.")
        lines += [
            f"  - {{name: by-regex, backend: vllm, url: 'http://{hosts[N]}', source: prometheus, "
            f"prometheus_selector: 'instance=~\"{regex}\"'}}",
            "  - {name: down, backend: vllm, url: 'http://127.0.0.1:9', source: prometheus}",
            "  - {name: unscraped, backend: vllm, url: 'http://127.0.0.1:1', source: prometheus, "
            "prometheus_selector: 'job=\"nope\"'}",
        ]
        cfg = parse_config(
            f"store: {{url: 'sqlite:///{tmp_path}/tuner.db'}}\nlisten: 127.0.0.1:0\n"
            f"prometheus: {{url: '{prom.url}'}}\ntargets:\n" + "\n".join(lines) + "\n"
        )
        deadline = time.monotonic() + 60
        while True:  # every target scraped at least 5 times (:9 too: it is up == 0)
            q = urllib.parse.quote("count(count_over_time(up[1m]) >= 5)")
            body = urllib.request.urlopen(f"{prom.url}/api/v1/query?query={q}", timeout=5).read().decode()
            if f'"{N + 2}"' in body:
                break
            assert time.monotonic() < deadline, body
            time.sleep(0.5)

        at = time.time() - 3  # every scrape up to here is in Prometheus: both reads see the same samples
        before = _queries(prom.url)
        fleet = scrape_fleet(prom.url, cfg.targets, timeout_s=10, now=at)
        assert _queries(prom.url) - before == 2  # up, and the vLLM series: not two per target
        for t in cfg.targets[: N + 1]:
            got = fleet[t.name]
            assert not isinstance(got, ScrapeError), (t.name, got)
            alone = scrape_via_prometheus(prom.url, t, timeout_s=10, now=at)
            assert got.engines == alone.engines and got.engines[0].histograms, t.name
            assert got.engines[0].values[("vllm:num_requests_running", ())] >= 0
        mine = {
            t.name: fleet[t.name].engines[0].values[("vllm:prompt_tokens_total", ())]  # type: ignore[union-attr]
            for t in cfg.targets[: N + 1]
        }
        assert len(set(mine.values())) > 1  # each target got its own series, not one target's copied
        assert isinstance(fleet["down"], ScrapeError) and "up == 0" in str(fleet["down"])
        assert isinstance(fleet["unscraped"], ScrapeError) and "no vllm series" in str(fleet["unscraped"])

        # The daemon's job stores each one's result, the failures as failures.
        store = migrated_store(tmp_path, "daemon.db")
        daemon = Daemon(cfg, store)
        assert daemon.scraping.scrape_fleet_once(list(cfg.targets)) == N + 1
        for t in cfg.targets[: N + 1]:
            health = store.health(t.name)
            assert health is not None and health.health == "up", t.name
        down = store.health("down")
        assert down is not None and down.health == "down" and "up == 0" in down.last_error
