"""Pods discovered through Prometheus: a real Prometheus whose scrape config relabels kubernetes_sd's meta labels
into ``namespace`` and ``pod`` (the relabeling kube-prometheus and most charts use) scrapes the "pods"; tuner reads
the pods from its ``up`` series and each pod's series through the existing Prometheus source.

No cluster runs here, so the targets carry the ``__meta_kubernetes_*`` labels kubernetes_sd would give them in a
static config, and the relabeling turns them into target labels exactly as it does for kubernetes_sd. The pods are
recorded vLLM expositions served with counters advancing (tuner.lab.replay).
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import realservers
from conftest import require

from tests.helpers import VLLM_DIR, migrated_store
from tuner.apply.launch import ServerProcess, free_port
from tuner.collect.promsource import scrape_fleet
from tuner.config import parse_config
from tuner.daemon.jobs import Daemon
from tuner.errors import ScrapeError
from tuner.kube import expand, list_pods
from tuner.lab.replay import ReplayExposition, ReplayServer

PODS = {
    "chat-7d9f8c6b5-x2x4z": "llm",
    "chat-7d9f8c6b5-q8w2n": "llm",
    "chat-7d9f8c6b5-zzzzz": "other",
    "chatter-5d8c7-aaaaa": "llm",
}


def _prometheus(tmp_path: Path, hosts: dict[str, str]) -> tuple[ServerProcess, str]:
    port = free_port()
    home = tmp_path / "prometheus"
    (home / "data").mkdir(parents=True)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "vllm",
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "static_configs": [
                    {
                        "targets": [host],
                        "labels": {"__meta_kubernetes_namespace": PODS[pod], "__meta_kubernetes_pod_name": pod},
                    }
                    for pod, host in hosts.items()
                ],
                "relabel_configs": [
                    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                ],
            }
        ],
    }
    (home / "prometheus.yml").write_text(json.dumps(config))
    argv = [
        str(realservers.PROMETHEUS.path()),
        f"--config.file={home / 'prometheus.yml'}",
        f"--storage.tsdb.path={home / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    return ServerProcess.start(argv, None, home / "prometheus.log", cwd=home), f"http://127.0.0.1:{port}"


def test_pods_named_by_kubernetes_sd_labels_become_targets_read_through_prometheus(tmp_path):
    require(realservers.PROMETHEUS)
    text = (VLLM_DIR / "metrics_under_load.txt").read_text()
    with ExitStack() as stack:
        expositions = {pod: ReplayExposition(text, growth=0.01 * (i + 1)) for i, pod in enumerate(PODS)}
        for i, expo in enumerate(expositions.values()):
            expo.scrapes = 50 * i  # each pod's counters differ from its first scrape on (the read may land on it)
        servers = {pod: stack.enter_context(ReplayServer(expo)) for pod, expo in expositions.items()}
        proc, url = _prometheus(tmp_path, {pod: s.url.split("://")[1] for pod, s in servers.items()})
        stack.callback(proc.stop, 10)
        deadline = time.monotonic() + 60
        while True:  # every pod scraped a few times
            q = urllib.parse.quote("count(count_over_time(up[1m]) >= 3)")
            try:
                body = urllib.request.urlopen(f"{url}/api/v1/query?query={q}", timeout=5).read().decode()
            except OSError:
                body = ""
            if f'"{len(PODS)}"' in body:
                break
            assert time.monotonic() < deadline, body
            time.sleep(0.5)
        cfg = parse_config(
            f"store: {{url: 'sqlite:///{tmp_path}/tuner.db'}}\nlisten: 127.0.0.1:0\n"
            f"prometheus: {{url: '{url}'}}\ntargets:\n"
            "  - {name: chat, backend: vllm, url: 'http://chat.llm.svc:8000', source: prometheus, "
            "prometheus_selector: 'job=\"vllm\"', kubernetes: {namespace: llm, name: chat, "
            "container: vllm, pods: {}}}\n"
        )
        at = time.time() - 2
        found = list_pods(cfg, None, now=at)
        assert sorted(p.name for p in found["chat"]) == ["chat-7d9f8c6b5-q8w2n", "chat-7d9f8c6b5-x2x4z"]
        targets = expand(cfg, found).targets
        assert [t.name for t in targets] == ["chat.chat-7d9f8c6b5-q8w2n", "chat.chat-7d9f8c6b5-x2x4z"]
        fleet = scrape_fleet(url, targets, timeout_s=10, now=at)
        prompt = {}
        for t in targets:
            got = fleet[t.name]
            assert not isinstance(got, ScrapeError), (t.name, got)
            # read as the server's own series: without the labels Prometheus put on the target (namespace, pod)
            assert not [key for key in got.engines[0].values if any(k in ("namespace", "pod") for k, _ in key[1])]
            prompt[t.name] = got.engines[0].values[("vllm:prompt_tokens_total", ())]
        assert len(set(prompt.values())) == 2  # each pod its own series, not one pod's read twice
        # the daemon starts with the same pods and reads them in its fleet job
        daemon = Daemon(cfg, migrated_store(tmp_path, "daemon.db"))
        assert sorted(daemon.state.targets) == [t.name for t in targets]
        assert daemon.scraping.scrape_fleet_once(list(daemon.cfg.targets)) == 2
