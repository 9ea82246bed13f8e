"""Smoke test for the integration tier: each real server starts, is healthy and exposes what tuner reads."""

from __future__ import annotations

import time

import requests

from realservers import RealServer
from tuner.lab import run_load


def _get(url: str) -> requests.Response:
    return requests.get(url, timeout=10)


def test_vllm_serves_metrics_and_completions(vllm_server: RealServer):
    assert _get(vllm_server.url + "/health").status_code == 200
    result = run_load(vllm_server.url, model=vllm_server.model_name, n_requests=4, concurrency=2,
                      prompt_tokens_approx=32, max_tokens=8, timeout_s=60)
    assert result.ok == 4, result.errors
    metrics = _get(vllm_server.url + "/metrics")
    assert metrics.status_code == 200
    assert "vllm:num_requests_running" in metrics.text
    assert "vllm:cache_config_info" in metrics.text


def test_llama_server_serves_metrics_and_slots(llama_server: RealServer):
    assert _get(llama_server.url + "/health").status_code == 200
    result = run_load(llama_server.url, model=None, n_requests=4, concurrency=2, prompt_tokens_approx=32,
                      max_tokens=16, timeout_s=60)
    assert result.ok == 4, result.errors
    metrics = _get(llama_server.url + "/metrics")
    assert metrics.status_code == 200
    assert "llamacpp:requests_processing" in metrics.text
    slots = _get(llama_server.url + "/slots").json()
    assert len(slots) == 2  # --parallel 2


def test_llama_server_without_metrics_answers_501(llama_server_no_metrics: RealServer):
    assert _get(llama_server_no_metrics.url + "/health").status_code == 200
    assert _get(llama_server_no_metrics.url + "/metrics").status_code == 501


def test_prometheus_scrapes_llama_server(llama_server: RealServer, prometheus_factory):
    prom = prometheus_factory([f"127.0.0.1:{llama_server.port}"], interval_s=1.0)
    deadline = time.monotonic() + 30
    result: list = []
    while time.monotonic() < deadline and not result:
        body = _get(prom.url + "/api/v1/query?query=llamacpp:requests_processing").json()
        result = body["data"]["result"]
        time.sleep(0.5)
    assert result, "Prometheus never stored llamacpp:requests_processing"
    up = _get(prom.url + "/api/v1/query?query=up").json()["data"]["result"]
    assert [r["value"][1] for r in up] == ["1"]
