"""tuner's own /metrics, scraped over HTTP and read back with prometheus_client's parser."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import fixture_text
from tests.test_cli import _line_value
from tuner.collect import http
from tuner.config import parse_config
from tuner.daemon import Daemon
from tuner.exporter import serve_metrics
from tuner.lab.replay import ReplayExposition, ReplayServer


def _samples(body: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body) for s in f.samples}


def test_exports_health_and_signals_per_target(store):
    text = fixture_text("vllm-0.32-cpu/metrics_after_load.txt")
    with ReplayServer(ReplayExposition(text, growth=0.05)) as server:
        cfg = parse_config(f"targets:\n  - {{name: v, backend: vllm, url: '{server.url}'}}\n"
                           "  - {name: gone, backend: vllm, url: 'http://127.0.0.1:9'}\n")
        daemon = Daemon(cfg, store)
        for _ in range(3):
            for t in cfg.targets:
                daemon.scrape_once(t)
            time.sleep(0.2)
        daemon.signals_once()
        daemon.gpu_once()
        daemon._job_error("notify:http://127.0.0.1:9093", "ConnectionError")
    httpd, thread = serve_metrics(daemon.state, "127.0.0.1", 0)
    try:
        port = httpd.server_address[1]
        body = http.get(f"http://127.0.0.1:{port}/metrics", timeout_s=5, max_bytes=2**22).body.decode()
    finally:
        httpd.shutdown()
    got = _samples(body)
    assert got[("tuner_target_up", (("target", "v"),))] == 1.0
    assert got[("tuner_target_up", (("target", "gone"),))] == 0.0
    assert got[("tuner_target_health", (("health", "down"), ("target", "gone")))] == 1.0
    assert got[("tuner_scrapes_total", (("target", "v"),))] == 3.0
    assert got[("tuner_scrape_failures_total", (("target", "gone"),))] == 3.0
    eng = (("backend", "vllm"), ("engine", "0"), ("model_name", "tiny-llama"), ("target", "v"))
    assert got[("tuner_kv_cache_usage_ratio", eng)] == _line_value(text, "vllm:kv_cache_usage_perc")
    assert got[("tuner_prompt_tokens_per_second", eng)] > 0
    assert ("tuner_e2e_seconds", tuple(sorted(eng + (("quantile", "0.99"),)))) in got
    assert got[("tuner_job_error", (("job", "notify:http://127.0.0.1:9093"),))] == 1.0
    # No GPU on this machine and gpu.source is none: telemetry reported unavailable, no GPU series.
    assert got[("tuner_gpu_telemetry_available", (("source", "none"),))] == 0.0
    assert not any(name.startswith("tuner_gpu_memory") for name, _ in got)
