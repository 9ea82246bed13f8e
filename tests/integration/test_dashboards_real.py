"""Every dashboard query returns data from a real Prometheus scraping real servers under real load.

Prometheus 2.42 scrapes a real vLLM (CPU build), a real llama-server, tuner's own /metrics (tuner runs against
both servers) and a dcgm-exporter stand-in. There is no GPU on these machines, so the GPU series come from the
recorded dcgm-exporter fixture (tests/fixtures/dcgm-exporter/, hand-written in dcgm-exporter's real format, see
its README) replayed over HTTP by tuner.lab.replay.ReplayServer: Prometheus scrapes its DCGM_FI_DEV_* names,
and tuner reads it as its `gpu: {source: dcgm}` and exports real tuner_gpu_* series from it.

Grafana's variables are substituted as Grafana would with "All" selected: $target/$model/$gpu -> `.*`,
$__rate_interval -> 1m (2 s scrapes that may time out on a loaded 2-core machine). Annotation queries are events (`> 0` on increases, firing alerts): each must run, and
the series it selects must exist; the firing-alert one must return data (a rule fires on a refused target).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import realservers
import requests
from conftest import require
from realservers import run_load_process, running

from tests.helpers import fixture_text
from tuner.apply.launch import ServerProcess, free_port
from tuner.config import parse_config
from tuner.daemon import Daemon
from tuner.daemon.metrics import serve_metrics
from tuner.dashboards import build_dashboards, metric_names, queries, substitute
from tuner.dashboards.build import PENDING_SERIES
from tuner.dashboards.queries import DEFAULT_VARIABLES
from tuner.lab.replay import ReplayExposition, ReplayServer

VARIABLES = {**DEFAULT_VARIABLES, "__rate_interval": "1m"}
# Series that cannot have data on these machines, and why: their panels' queries must run, and are not asked for data.
NOT_HERE = {
    "tuner_memory_weights_bytes": "the memory model's, for a target whose model tuner knows (managed)",
    "tuner_memory_overhead_bytes": "the memory model's, for a target whose model tuner knows (managed)",
    "tuner_memory_gpu_process_used_bytes": "NVML's, on a GPU",
    "tuner_memory_gpu_total_bytes": "on a GPU",
}


def _prometheus(tmp_path: Path, jobs: dict[str, tuple[str, dict[str, str]]]) -> realservers.RealServer:
    """Prometheus with one job per scraped endpoint, each with its labels (a server's `target`, as docs/alerts.md
    says)."""
    require(realservers.PROMETHEUS)
    port, home = free_port(), tmp_path / "prometheus"
    (home / "data").mkdir(parents=True)
    config = {
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
        "scrape_configs": [
            {
                "job_name": job,
                "scrape_interval": "2s",
                "scrape_timeout": "2s",
                "static_configs": [{"targets": [hostport], "labels": labels}],
            }
            for job, (hostport, labels) in jobs.items()
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
    proc = ServerProcess.start(argv, None, home / "prometheus.log", cwd=home)
    return realservers._started("prometheus", proc, f"http://127.0.0.1:{port}", 30.0, None, path="/-/ready")


def _query(prom: str, expr: str, at: float) -> list[dict]:
    r = requests.get(f"{prom}/api/v1/query", params={"query": expr, "time": at}, timeout=30)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body.get('error')}"
    return body["data"]["result"]


def _label_values(prom: str, label: str, selector: str) -> list[str]:
    r = requests.get(
        f"{prom}/api/v1/label/{label}/values", params={"match[]": selector, "start": time.time() - 300}, timeout=30
    )
    return r.json()["data"]


def _rules(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "groups:\n  - name: test\n    interval: 1s\n    rules:\n"
        "      - {alert: TargetDown, signal: up, op: '==', threshold: 0, for: 3s,"
        " labels: {severity: critical}}\n"
    )
    return path


def test_every_dashboard_query_returns_data(vllm_server, llama_server, store, tmp_path):
    dashboards = build_dashboards()
    dcgm = ReplayServer(ReplayExposition(fixture_text("dcgm-exporter/metrics_2gpus.txt"), growth=0.01))
    with dcgm:
        cfg = parse_config(
            "defaults: {scrape_interval: 1s, scrape_timeout: 1s, signal_window: 30s}\n"
            f"gpu: {{source: dcgm, url: '{dcgm.url}/metrics', interval: 1s}}\n"
            f"alerting: {{rule_files: ['{_rules(tmp_path)}']}}\n"
            "targets:\n"
            # the flags it runs with (realservers.VLLM_TINY_FLAGS): queue / max-num-seqs has a denominator
            f"  - {{name: vllm, backend: vllm, url: '{vllm_server.url}', slo: {{ttft_p99: 2s, e2e_p99: 60s}}, "
            "flags: {max-num-seqs: 8}}\n"
            f"  - {{name: llama, backend: llamacpp, url: '{llama_server.url}'}}\n"
            # auto mode on the refused target: its auto series are served (AutoLoopStalled's panel)
            "  - {name: refused, backend: vllm, url: 'http://127.0.0.1:9', apply: {mode: auto}}\n"
        )
        daemon = Daemon(cfg, store)
        httpd, _ = serve_metrics(daemon.state, "127.0.0.1", 0)
        tuner_host = f"127.0.0.1:{httpd.server_address[1]}"
        prom = _prometheus(
            tmp_path,
            {
                "vllm": (vllm_server.url.split("://")[1], {"target": "vllm"}),
                "llama": (llama_server.url.split("://")[1], {"target": "llama"}),
                "tuner": (tuner_host, {}),
                "dcgm": (dcgm.url.split("://")[1], {}),
            },
        )
        try:
            with running(daemon):
                time.sleep(4)  # idle samples first: rates need two points
                # ... and a loaded llama-server (-t 1 next to a busy vLLM) can miss every scrape while it decodes,
                # so its rate needs a sample from before the load: wait until Prometheus has one.
                deadline = time.monotonic() + 60
                while not _query(prom.url, "llamacpp:tokens_predicted_total", time.time()):
                    assert time.monotonic() < deadline, "Prometheus never scraped llama-server"
                    time.sleep(0.5)
                loads = {}
                threads = [
                    threading.Thread(
                        target=lambda: loads.__setitem__(
                            "vllm",
                            run_load_process(
                                vllm_server.url,
                                model=vllm_server.model_name,
                                n_requests=32,
                                concurrency=12,
                                prompt_tokens_approx=200,
                                max_tokens=256,
                                timeout_s=300,
                            ),
                        )
                    ),
                    # ahead of the servers: beside a loaded vLLM on 2 cores a starved client once lost 2 of 24
                    # requests to llama-server's 5 s idle close of a new connection (test_realservers_smoke.py)
                    threading.Thread(
                        target=lambda: loads.__setitem__(
                            "llama",
                            run_load_process(
                                llama_server.url,
                                ahead=True,
                                model=None,
                                n_requests=24,
                                concurrency=6,
                                prompt_tokens_approx=100,
                                max_tokens=300,
                                timeout_s=300,
                            ),
                        )
                    ),
                ]
                load_start = time.time()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(330)
                time.sleep(4)  # tuner's signals job and Prometheus catch the end of the load
                at = time.time()
                results = {}
                for d in dashboards.values():
                    for q in queries(d):
                        if q.kind == "variable":
                            continue
                        results[q] = _query(prom.url, substitute(q.expr, VARIABLES), at)
                variables = {
                    q: [_label_values(prom.url, lbl, substitute(q.expr)) for lbl in _var_label(d, q)]
                    for d in dashboards.values()
                    for q in queries(d)
                    if q.kind == "variable"
                }
                # Annotations are events (none may have happened): the series they select must exist.
                event_series = {
                    name: bool(_query(prom.url, name, at))
                    for q in results
                    if q.kind == "annotation"
                    for name in metric_names(q.expr)
                }
                # llama-server's load ends long before vLLM's on 2 cores: its rate is read over a window that
                # reaches back before the load started (the sample waited for above).
                llama_tps = next(
                    q for q in results if q.dashboard == "tuner-llama-server" and q.where == "Tokens per second [B]"
                )
                window = f"{int(at - load_start) + 10}s"
                llama_tps_at_end = _query(
                    prom.url, substitute(llama_tps.expr, {**VARIABLES, "__rate_interval": window}), at
                )
        finally:
            httpd.shutdown()
            prom.stop(grace_s=10)
    assert loads["vllm"].ok == 32 and loads["llama"].ok == 24, loads

    # Queries on series tuner's exporter does not serve yet (PENDING_SERIES) must be empty, every other one not.
    pending = {q for q in results if metric_names(q.expr) & PENDING_SERIES}
    empty = [
        f"{q.dashboard} / {q.where}: {q.expr}"
        for q, r in results.items()
        if q.kind == "panel" and not r and q not in pending and not metric_names(q.expr) <= set(NOT_HERE)
    ]
    assert empty == [], "panel queries without data:\n" + "\n".join(empty)
    assert not [q.where for q in pending if results[q]], "a pending series has data: empty PENDING_SERIES"
    assert {n: ok for n, ok in event_series.items() if n not in PENDING_SERIES and not ok} == {}, event_series
    assert (
        sum(1 for q in results if q.kind == "panel" and results[q]) >= 70
    )  # 77 panel queries, 5 need a GPU or a model
    assert [v for q, vals in variables.items() for v in vals if not v] == [], variables
    firing = [q for q in results if q.where == "annotation Alerts firing"]
    assert firing and all(results[q] for q in firing), "the refused target's alert did not fire"

    def value(uid: str, where: str) -> float:
        q = next(q for q in results if q.dashboard == uid and q.where == where)
        return max(
            (float(s["value"][1]) for s in results[q] if s["value"][1] not in ("NaN", "+Inf", "-Inf")),
            default=float("nan"),
        )

    # The load shows: latency quantiles are real numbers, tokens flowed, GPUs read through tuner and dcgm.
    assert 0 < value("tuner-vllm", "Time to first token [C]") < 60
    assert 0 < value("tuner-vllm", "End-to-end latency [C]") < 120
    assert value("tuner-vllm", "Tokens per second [B]") > 0
    assert max((float(r["value"][1]) for r in llama_tps_at_end), default=0.0) > 0, llama_tps_at_end
    assert value("tuner-gpu", "Utilization [A]") == 0.37  # GPU 0 of the fixture, via tuner_gpu_utilization_ratio
    assert value("tuner-self", "Targets down [A]") == 1


def _var_label(model: dict, q) -> list[str]:  # type: ignore[no-untyped-def]
    v = next(v for v in model["templating"]["list"] if f"variable {v['name']}" == q.where)
    return [v["query"].rsplit(",", 1)[1].strip(" )")]
