"""Targets discovered from Kubernetes (tuner/kube/pods.py, tuner/kube/discovery.py): one target per pod of a
workload, grouped under the template, added and removed as pods come and go; the store keeps a gone pod's history.

The tests that take ``cluster`` run against the stand-in API server (tests/k8s_standin.py: a real local HTTP
server with the official client's object shapes and watch events; no kube-apiserver can run on these machines) and,
when $KUBECONFIG is set, against that real cluster too (skipped otherwise). The daemon test's pods are served by real
local HTTP servers on the pods' loopback IPs, replaying a recorded vLLM exposition.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.helpers import VLLM_DIR, migrated_store, wait_until
from tests.k8s_clusters import CLUSTERS, StandIn, open_cluster
from tuner.apply.launch import free_port
from tuner.config import parse_config
from tuner.daemon.jobs import Daemon
from tuner.kube import connect, list_pods
from tuner.kube.pods import PodWatch, expand, members, pods_from_prometheus, templates
from tuner.lab.replay import ReplayExposition

ARGS = ["serve", "/models/qwen", "--max-num-seqs", "4"]


@pytest.fixture(params=CLUSTERS)
def cluster(request, tmp_path):
    c = open_cluster(request.param, tmp_path)
    yield c
    c.close()


def _config(c: Any, *, extra: str = "", port: int | None = None, store: str = "") -> str:
    pods = f"{{selector: 'app=chat', port: {port}}}" if port else "{selector: 'app=chat'}"
    return (
        f"kubernetes: {{kubeconfig: '{c.kubeconfig}'}}\nlisten: 127.0.0.1:0\n{store}"
        f"targets:\n  - name: chat\n    backend: vllm\n    url: http://chat.{c.namespace}.svc:8000\n"
        f"    scrape_interval: 1s\n"
        f"    kubernetes: {{namespace: {c.namespace}, name: chat, container: vllm, pods: {pods}}}\n{extra}"
    )


def test_discovery_follows_pods_as_they_come_and_go(cluster, tmp_path):
    """Stand-in API server (or $KUBECONFIG's cluster): a list, then a watch; a pod counts from its first Ready."""
    c = cluster
    c.deployment("chat", replicas=2, args=ARGS, labels={"app": "chat"})
    c.deployment("other", replicas=1, args=ARGS, labels={"app": "other"})
    cfg = parse_config(_config(c))
    changes = threading.Semaphore(0)
    watch = PodWatch(connect(cfg.kubernetes), templates(cfg), changed=changes.release, watch_s=5)
    names = lambda: sorted(p.name for p in watch.found()["chat"])  # noqa: E731
    first = c.pods("chat")
    assert sorted(p.name for p in watch.list_now()["chat"]) == first
    watch.start()
    try:
        if c.real:
            time.sleep(2)
        else:  # the deletion comes as a watch event, not in the watch's first list
            assert wait_until(lambda: ("GET", "/api/v1/namespaces/llm/pods", "watch") in c.cluster.requests, 10)
        c.delete_pod(first[0])
        assert wait_until(lambda: names() == [first[1]], 20), names()
        if not c.real:
            c.cluster.tick()  # the replacement is created: it runs, but is not ready yet
            assert wait_until(lambda: len(c.cluster.pod_names("llm", "chat")) == 2, 5)
            time.sleep(0.5)
            assert names() == [first[1]]  # not counted before its first Ready
        c.settle("chat")
        assert wait_until(lambda: len(names()) == 2, 60), names()
        second = names()
        assert first[1] in second and first[0] not in second and second == c.pods("chat")
        # the targets: one per pod, named TEMPLATE.POD, at the pod's IP and container port, grouped as chat
        targets = expand(cfg, watch.found()).targets
        assert [t.name for t in targets] == [f"chat.{p}" for p in second]
        assert all(
            t.group == "chat"
            and t.group_url == cfg.targets[0].url
            and t.url.endswith(":8000")
            and t.labels["namespace"] == c.namespace
            and t.labels["workload"] == "chat"
            for t in targets
        )
        assert {t.flags["max_num_seqs"] for t in targets} == {4}
    finally:
        watch.stop()


def test_a_watch_whose_history_is_gone_lists_again(tmp_path):
    """Stand-in API server: the watch's resourceVersion is compacted away (410 Gone): tuner lists and watches on."""
    c = StandIn(tmp_path)
    try:
        c.deployment("chat", replicas=2, args=ARGS, labels={"app": "chat"})
        cfg = parse_config(_config(c))
        errors: list[str] = []
        watch = PodWatch(
            connect(cfg.kubernetes),
            templates(cfg),
            watch_s=5,
            failed=lambda name, error: errors.append(error) if error else None,
        )
        watch.start()
        assert wait_until(lambda: len(watch.found()["chat"]) == 2, 10)
        gone = c.pods("chat")[0]
        c.cluster.compact()  # the history the watch would resume from is gone...
        c.delete_pod(gone)  # ...and a pod goes meanwhile
        c.settle("chat")
        assert wait_until(lambda: sorted(p.name for p in watch.found()["chat"]) == c.pods("chat"), 20)
        assert gone not in [p.name for p in watch.found()["chat"]]
        assert not errors  # a 410 is not a failure: it lists again
        assert any(r[1].endswith("/pods") for r in c.cluster.requests[-10:])
        watch.stop()
    finally:
        c.close()


def test_a_template_that_cannot_be_listed_says_why_in_one_line(tmp_path):
    """Stand-in API server: a bad token is a 401, a missing kubeconfig a config error; both name what to fix."""
    c = StandIn(tmp_path)
    try:
        cfg = parse_config(_config(c))
        c.cluster.token = "rotated"
        with pytest.raises(
            Exception,
            match=r"targets\[chat\]: Kubernetes list pods in llm \(app=chat\): 401 "
            r"Unauthorized; the credentials were refused",
        ):
            list_pods(cfg, None, now=time.time())
        missing = parse_config(_config(c).replace(str(c.kubeconfig), str(tmp_path / "nope")))
        with pytest.raises(Exception, match="Kubernetes config: .*set kubernetes.kubeconfig"):
            list_pods(missing, None, now=time.time())
    finally:
        c.close()


class _PodServers:
    """Real HTTP servers on the stand-in's pod IPs (127.0.0.N), each replaying a recorded vLLM exposition."""

    def __init__(self, port: int, ips: list[str]) -> None:
        text = (VLLM_DIR / "metrics_under_load.txt").read_text()
        self.servers = []
        for ip in ips:
            expo = ReplayExposition(text)

            class H(BaseHTTPRequestHandler):
                def do_GET(self, expo: ReplayExposition = expo) -> None:  # noqa: N802
                    body = expo.render() if self.path == "/metrics" else b""
                    self.send_response(200 if self.path in ("/metrics", "/health") else 404)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

                def log_message(self, *args: object) -> None:
                    pass

            srv = ThreadingHTTPServer((ip, port), H)
            srv.daemon_threads = True
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            self.servers.append(srv)

    def close(self) -> None:
        for s in self.servers:
            s.shutdown()
            s.server_close()


@pytest.fixture
def pod_servers() -> Iterator[tuple[int, _PodServers]]:
    port = free_port()
    servers = _PodServers(port, [f"127.0.0.{n}" for n in range(2, 8)])
    yield port, servers
    servers.close()


def test_the_daemon_scrapes_each_pod_and_keeps_a_gone_pods_history(tmp_path, pod_servers):
    """Stand-in API server: `tuner run` scrapes the pods it discovers, stops scraping one that is gone (its history
    stays in the store) and starts on its replacement."""
    port, _ = pod_servers
    c = StandIn(tmp_path)
    try:
        c.deployment("chat", replicas=2, args=ARGS, labels={"app": "chat"}, port=port)
        cfg = parse_config(_config(c, store=f"store: {{url: 'sqlite:///{tmp_path}/tuner.db'}}\n"))
        store = migrated_store(tmp_path)
        daemon = Daemon(cfg, store, config_dir=tmp_path)
        first = c.pods("chat")
        assert sorted(daemon.state.targets) == [f"chat.{p}" for p in first]
        run = threading.Thread(
            target=daemon.run_forever, kwargs={"install_signal_handlers": False, "max_seconds": 120}, daemon=True
        )
        run.start()
        try:
            scraped = lambda name: store.scrapes(name)  # noqa: E731
            assert wait_until(lambda: all(scraped(f"chat.{p}") >= 2 for p in first), 30)
            c.delete_pod(first[0])
            gone = f"chat.{first[0]}"
            assert wait_until(lambda: gone not in daemon.state.targets, 20), sorted(daemon.state.targets)
            time.sleep(1.5)  # a scrape in flight may still land
            count = scraped(gone)
            c.settle("chat")
            new = [p for p in c.pods("chat") if p not in first]
            assert len(new) == 1
            assert wait_until(lambda: scraped(f"chat.{new[0]}") >= 2, 30)
            assert scraped(gone) == count  # no longer scraped...
            assert gone in store.target_names()  # ...and its history is kept
            w = store.window(gone, time.time() - 120, time.time())
            assert w.engines and sum(len(pts) for e in w.engines for pts in e.series.values()) >= count
            # the group is the pods there are now; the applier and the alert rules see the same
            group = sorted(m.name for m in daemon.cfg.group(daemon.cfg.target(f"chat.{new[0]}")))
            assert group == sorted([f"chat.{first[1]}", f"chat.{new[0]}"])
            assert daemon.applier.cfg is daemon.cfg and daemon.alerting.cfg is daemon.cfg
        finally:
            daemon.stop()
            run.join(30)
    finally:
        c.close()


def test_pods_read_from_prometheus_kubernetes_sd_labels():
    """The labels a kubernetes_sd relabeling gives each series name the pods: the template's own and its canary's,
    by the names a Deployment and a StatefulSet give their pods."""
    cfg = parse_config(
        "prometheus: {url: 'http://127.0.0.1:9'}\ntargets:\n"
        "  - {name: chat, backend: vllm, url: 'http://chat.llm.svc:8000', source: prometheus, "
        "prometheus_selector: 'job=\"vllm\"', kubernetes: {namespace: llm, name: chat, container: vllm, "
        "canary: chat-canary, pods: {pod_label: kubernetes_pod_name}}}\n"
        "  - {name: kv, backend: vllm, url: 'http://kv.llm.svc:8000', source: prometheus, "
        "kubernetes: {kind: StatefulSet, namespace: llm, name: kv, container: vllm, pods: {}}}\n"
    )
    chat, kv = cfg.targets
    series = [
        {"namespace": "llm", "kubernetes_pod_name": "chat-7d9f8c6b5-x2x4z", "instance": "10.0.0.5:8000"},
        {"namespace": "llm", "kubernetes_pod_name": "chat-canary-5f4d9-abcde", "instance": "10.0.0.6:8000"},
        {"namespace": "other", "kubernetes_pod_name": "chat-7d9f8c6b5-zzzzz", "instance": "10.0.1.5:8000"},
        {"namespace": "llm", "kubernetes_pod_name": "chatter-7d9f8c6b5-x2x4z", "instance": "10.0.0.7:8000"},
        {"namespace": "llm", "kubernetes_pod_name": "chat-7d9f8c6b5-x2x4z", "instance": "10.0.0.5:8000"},
    ]
    pods = pods_from_prometheus(series, chat)
    assert sorted((p.name, p.owner) for p in pods) == [
        ("chat-7d9f8c6b5-x2x4z", "chat"),
        ("chat-canary-5f4d9-abcde", "chat-canary"),
    ]
    ms = members(chat, pods)
    assert [m.name for m in ms] == ["chat.chat-7d9f8c6b5-x2x4z", "chat.chat-canary-5f4d9-abcde"]
    assert ms[0].source == "prometheus" and ms[0].url == "http://10.0.0.5:8000"
    assert ms[0].prometheus_selector == 'job="vllm",namespace="llm",kubernetes_pod_name="chat-7d9f8c6b5-x2x4z"'
    kv_pods = pods_from_prometheus(
        [
            {"namespace": "llm", "pod": "kv-0"},
            {"namespace": "llm", "pod": "kv-1"},
            {"namespace": "llm", "pod": "kv-abc12-defgh"},
        ],
        kv,
    )
    assert sorted(p.name for p in kv_pods) == ["kv-0", "kv-1"]


def test_a_session_lists_the_pods_for_the_cli(tmp_path):
    """Stand-in API server: a command's session has the pods as targets, as the daemon does."""
    from tuner.app.session import Session

    c = StandIn(tmp_path)
    try:
        c.deployment("chat", replicas=2, args=ARGS, labels={"app": "chat"})
        path = tmp_path / "tuner.yaml"
        path.write_text(_config(c, store=f"store: {{url: 'sqlite:///{tmp_path}/tuner.db'}}\n"))
        assert [t.name for t in Session.load(str(path)).cfg.targets] == ["chat"]  # the template: not listed
        s = Session.load(str(path), pods=True)
        assert [t.name for t in s.cfg.targets] == [f"chat.{p}" for p in c.pods("chat")]
        assert s.cfg.target(f"chat.{c.pods('chat')[0]}").group == "chat"
    finally:
        c.close()
