"""`tuner run` against real servers: what it stores moves with real load, and equals what Prometheus computes.

Servers: vLLM 0.32 CPU build on the tiny model (max-num-seqs 8), llama-server on the tiny GGUF
(--parallel 2), Prometheus 2.42 — all real, all on 127.0.0.1 (tests/integration/conftest.py).
"""

from __future__ import annotations

import math
import time

import pytest
from prometheus_api_client import PrometheusConnect
from realservers import run_load_process, running

from tuner.collect.promsource import raw_snapshots, scrape_via_prometheus
from tuner.collect.vllm import scrape as scrape_vllm
from tuner.config import parse_config
from tuner.daemon import Daemon
from tuner.signals.derive import LATENCY_HISTOGRAMS, compute_signals, quantile
from tuner.store.db import open_engine, upgrade
from tuner.store.store import Store


def _points(store: Store, target: str, metric: str, start: float, end: float):
    engine = store.window(target, start, end).engines[0]
    return [p for (name, _), pts in engine.series.items() if name == metric for p in pts]


def test_vllm_signals_move_with_load_and_bad_targets_stay_recorded(vllm_server, llama_server_no_metrics, store):
    cfg = parse_config(
        "defaults: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        "targets:\n"
        f"  - {{name: vllm, backend: vllm, url: '{vllm_server.url}', slo: {{ttft_p99: 1s, e2e_p99: 30s}}}}\n"
        f"  - {{name: no-metrics, backend: llamacpp, url: '{llama_server_no_metrics.url}'}}\n"
        "  - {name: refused, backend: vllm, url: 'http://127.0.0.1:9'}\n"
    )
    daemon = Daemon(cfg, store)
    with running(daemon):
        time.sleep(3)
        t_load = time.time()
        # 16 at a time against --max-num-seqs 8: half of them have to wait.
        # Long answers keep the server busy for several 1 s scrapes (64 tokens finish within one).
        load = run_load_process(
            vllm_server.url,
            model=vllm_server.model_name,
            n_requests=48,
            concurrency=16,
            prompt_tokens_approx=300,
            max_tokens=320,
            timeout_s=300,
        )
        t_done = time.time()
        time.sleep(3)
    t_end = time.time()
    assert load.ok == 48, load.errors

    idle = compute_signals(store.window("vllm", t_load - 3, t_load - 0.5)).engines[0]
    busy = compute_signals(store.window("vllm", t_load, t_done)).engines[0]
    assert idle.requests_running == 0 and idle.requests_waiting_max == 0
    # The load is asserted through counters and histograms, not the running/waiting gauges: a loaded CPU vLLM
    # answers /metrics late exactly while its queue is longest (1 s scrapes time out then), so whether any
    # stored sample caught the queue is chance. Counts are cumulative: no missed scrape loses them.
    assert _increase(store, "vllm", "vllm:request_success_total", t_load - 3, t_end) == 48
    whole_queue = compute_signals(store.window("vllm", t_load - 2, t_end)).engines[0]
    # 16 clients against 8 slots: the second eight wait for a whole 320-token answer, far over 0.3 s.
    assert whole_queue.queued_over_s == 0.3 and whole_queue.requests_queued >= 8
    # KV use is a gauge too: every stored sample taken while a request ran must show KV blocks in use.
    for (ts, n_running), (ts_kv, kv) in zip(
        _points(store, "vllm", "vllm:num_requests_running", t_load, t_done),
        _points(store, "vllm", "vllm:kv_cache_usage_perc", t_load, t_done),
    ):
        assert ts == ts_kv and (kv > 0 or n_running == 0), (ts, n_running, kv)
    assert busy.generation_tokens_per_s > 0 and busy.prompt_tokens_per_s > 0

    # Counters: the stored increase is exactly what the load generated (the server served nothing else).
    gen = _points(store, "vllm", "vllm:generation_tokens_total", t_load - 3, t_end)
    prompt = _points(store, "vllm", "vllm:prompt_tokens_total", t_load - 3, t_end)
    assert gen[-1][1] - gen[0][1] == load.completion_tokens
    assert prompt[-1][1] - prompt[0][1] == load.prompt_tokens

    # Latency: every request of the load is in the E2E histogram over the whole run.
    whole = compute_signals(store.window("vllm", t_load - 2, t_end), slo=cfg.targets[0].slo).engines[0]
    assert whole.requests_in_window == pytest.approx(48, rel=0.2)  # extrapolated to the window's ends
    for p in ("ttft", "itl", "e2e", "queue"):
        p50, p99 = getattr(whole, f"{p}_p50"), getattr(whole, f"{p}_p99")
        assert p50 is not None and p99 is not None and 0 <= p50 <= p99, p
    assert whole.e2e_p99 <= load.latencies_s[-1] * 2 + 1  # within bucket resolution of the client's view
    assert 0 <= whole.goodput_ratio <= whole.goodput_ratio_upper <= 1

    # The other targets were scraped all along and recorded as down, with what to do.
    h = store.health("no-metrics")
    assert h.health == "down" and "--metrics" in h.last_error and h.consecutive_failures >= 5
    assert "connection refused" in store.health("refused").last_error
    assert store.health("vllm").health == "up"


def _increase(store: Store, target: str, metric: str, start: float, end: float) -> float:
    """The raw increase of a counter between the first and last stored sample, summed over its label sets."""
    engine = store.window(target, start, end).engines[0]
    return sum(pts[-1][1] - pts[0][1] for (name, _), pts in engine.series.items() if name == metric and pts)


def _max(store: Store, target: str, metric: str, start: float, end: float) -> float:
    return max(v for _, v in _points(store, target, metric, start, end))


def test_llama_server_deferred_slots_and_kv_use_are_recorded(llama_server, store):
    cfg = parse_config(
        "defaults: {scrape_interval: 200ms, scrape_timeout: 200ms}\n"
        f"targets:\n  - {{name: llama, backend: llamacpp, url: '{llama_server.url}'}}\n"
    )
    with running(Daemon(cfg, store)):
        time.sleep(1.5)
        t0 = time.time()
        # 8 at a time against --parallel 2: requests are deferred. The tiny GGUF is fast, so ask for long
        # answers (380 of the 512 tokens a slot holds) to keep the server busy across many scrapes.
        load = run_load_process(
            llama_server.url,
            model=None,
            n_requests=32,
            concurrency=8,
            prompt_tokens_approx=100,
            max_tokens=380,
            timeout_s=300,
        )
        t1 = time.time()
        time.sleep(1.5)
    assert load.ok == 32, load.errors
    # Both slots busy, from counters no scrape can miss: n_busy_slots_per_decode is the running average
    # busy slots / decodes since start, so over the load it is (a1*n1 - a0*n0) / (n1 - n0).
    end = time.time()
    busy_avg = _points(store, "llama", "llamacpp:n_busy_slots_per_decode", t0 - 1.5, end)
    decodes = _points(store, "llama", "llamacpp:n_decode_total", t0 - 1.5, end)
    (a0, a1), (n0, n1) = (busy_avg[0][1], busy_avg[-1][1]), (decodes[0][1], decodes[-1][1])
    assert (a1 * n1 - a0 * n0) / (n1 - n0) >= 1.5  # 8 clients for 2 slots: both decode together nearly always
    # The gauges below are samples; they hold here because llama-server answers /metrics between decode steps
    # of a few ms on the tiny GGUF, and 6 of the 8 clients wait for a slot for the whole load: every one of the
    # many 200 ms scrapes in it sees the queue. (A loaded vLLM is different: see the test above.)
    up_scrapes = len(_points(store, "llama", "llamacpp:requests_deferred", t0, t1))
    assert up_scrapes >= 5, f"only {up_scrapes} scrapes stored during the load"
    assert _max(store, "llama", "llamacpp:requests_deferred", t0, t1) >= 1
    assert _max(store, "llama", "tuner:slots_busy", t0, t1) == 2
    assert _max(store, "llama", "tuner:slots_total", t0, t1) == 2
    assert 0 < _max(store, "llama", "tuner:kv_cache_usage", t0, t1) <= 1
    predicted = _points(store, "llama", "llamacpp:tokens_predicted_total", t0 - 1.5, time.time())
    assert predicted[-1][1] - predicted[0][1] == load.completion_tokens
    sig = compute_signals(store.window("llama", t0, t1)).engines[0]
    assert sig.generation_tokens_per_s > 0 and sig.requests_waiting_max >= 1


def test_quantiles_and_rates_equal_prometheus_on_the_same_samples(vllm_server, prometheus_factory, tmp_path):
    """Prometheus scrapes the real vLLM; tuner stores exactly those samples and must compute the same numbers."""
    host = vllm_server.url.split("://")[1]
    prom = prometheus_factory([host], interval_s=1.0)
    client = PrometheusConnect(prom.url, disable_ssl=True)
    deadline = time.time() + 30
    while not client.custom_query("vllm:num_requests_running") and time.time() < deadline:
        time.sleep(0.5)
    time.sleep(2)  # a few idle samples before the load
    t_load = time.time()
    load = run_load_process(
        vllm_server.url,
        model=vllm_server.model_name,
        n_requests=48,
        concurrency=12,
        prompt_tokens_approx=200,
        max_tokens=96,
        timeout_s=300,
    )
    assert load.ok == 48, load.errors
    time.sleep(3)
    at = round(time.time() - 1, 3)
    range_s = math.ceil(at - t_load) + 5

    cfg = parse_config(f"targets:\n  - {{name: vllm, backend: vllm, url: '{vllm_server.url}'}}\n")
    target = cfg.targets[0]
    engine = open_engine(f"sqlite:///{tmp_path / 'same-samples.db'}")
    upgrade(engine)
    store = Store(engine)
    snaps = raw_snapshots(prom.url, target, start=at - range_s, end=at)
    # One per successful Prometheus scrape (a loaded CPU vLLM misses some 1 s scrapes: fewer, not wrong).
    assert len(snaps) >= 4
    for snap in snaps:
        store.ingest(snap)
    window = store.window("vllm", at - range_s, at)
    e = window.engines[0]
    sel = f'{{instance="{host}"}}'
    compared = 0
    for metric in LATENCY_HISTOGRAMS.values():
        for q in (0.5, 0.9, 0.99):
            theirs = client.custom_query(
                f"histogram_quantile({q}, increase({metric}_bucket{sel}[{range_s}s]))", params={"time": f"{at:.3f}"}
            )
            ours = quantile(e, metric, q, window.start_ms, window.end_ms)
            assert theirs, metric
            value = float(theirs[0]["value"][1])
            assert ours is not None and math.isclose(ours, value, rel_tol=1e-6), (metric, q, ours, value)
            compared += 1
    ours_sig = compute_signals(window).engines[0]
    for field, metric in (
        ("prompt_tokens_per_s", "vllm:prompt_tokens_total"),
        ("generation_tokens_per_s", "vllm:generation_tokens_total"),
        ("requests_per_s", "vllm:request_success_total"),
    ):
        theirs = client.custom_query(f"sum(rate({metric}{sel}[{range_s}s]))", params={"time": f"{at:.3f}"})
        value = float(theirs[0]["value"][1])
        assert value > 0 and math.isclose(getattr(ours_sig, field), value, rel_tol=1e-6), field
        compared += 1
    assert compared == 15

    # The Prometheus source gives the same snapshot a direct scrape gives (the server is idle now).
    via = scrape_via_prometheus(prom.url, target, timeout_s=5, now=time.time())
    direct = scrape_vllm(vllm_server.url, target="vllm", timeout_s=5, max_bytes=10 * 2**20)
    assert [x.as_json() for x in via.engines] == [x.as_json() for x in direct.engines]
    assert via.engines[0].histograms == direct.engines[0].histograms
