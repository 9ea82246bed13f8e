"""tuner's own /metrics, scraped over HTTP and read back with prometheus_client's parser."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from tests.cli.test_cli import _line_value
from tests.helpers import fixture_text
from tuner.collect import http
from tuner.config import parse_config
from tuner.daemon import Daemon
from tuner.daemon.metrics import serve_metrics
from tuner.lab.replay import ReplayExposition, ReplayServer


def _samples(body: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(body)
        for s in f.samples
    }


def test_exports_health_and_signals_per_target(store):
    text = fixture_text("vllm-0.32-cpu/metrics_after_load.txt")
    with ReplayServer(ReplayExposition(text, growth=0.05)) as server:
        cfg = parse_config(
            f"targets:\n  - {{name: v, backend: vllm, url: '{server.url}'}}\n"
            "  - {name: gone, backend: vllm, url: 'http://127.0.0.1:9'}\n"
        )
        daemon = Daemon(cfg, store)
        for _ in range(3):
            for t in cfg.targets:
                daemon.scraping.scrape_once(t)
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


def test_queue_ratio_uses_the_max_num_seqs_in_force_not_the_config_key(store, tmp_path):
    """A managed target's snake_case flags (as the demo writes them) and a kept apply both count; the raw
    ``flags["max-num-seqs"]`` key of old saw neither, so QueueDepthHighRelative could not fire."""
    from tuner.rules.evaluate import vector
    from tuner.store import journal as jr

    text = fixture_text("vllm-0.32-cpu/metrics_under_load.txt")
    waiting = _line_value(text, "vllm:num_requests_waiting")
    assert waiting >= 2
    (tmp_path / "model").mkdir()
    with ReplayServer(ReplayExposition(text, growth=0.05)) as server:
        cfg = parse_config(
            f"targets:\n  - name: v\n    backend: vllm\n    url: '{server.url}'\n"
            f"    managed: {{model: '{tmp_path / 'model'}', executable: /opt/vllm/bin/python, "
            "flags: {max_num_seqs: 4}}\n"
        )
        daemon = Daemon(cfg, store, config_dir=tmp_path)
        for _ in range(2):
            daemon.scraping.scrape_once(cfg.targets[0])
        daemon.signals_once()

    def exported() -> float | None:
        daemon.applying.status_once()
        httpd, _ = serve_metrics(daemon.state, "127.0.0.1", 0)
        try:
            body = http.get(
                f"http://127.0.0.1:{httpd.server_address[1]}/metrics", timeout_s=5, max_bytes=2**22
            ).body.decode()
        finally:
            httpd.shutdown()
        eng = (("backend", "vllm"), ("engine", "0"), ("model_name", "tiny-llama"), ("target", "v"))
        return _samples(body).get(("tuner_queue_to_max_num_seqs_ratio", eng))

    [rule] = [r for g in daemon.alerting.rules.groups for r in g.rules if r.alert == "QueueDepthHighRelative"]
    sig = daemon.state.signals["v"]

    def alert_value() -> float:
        [(_, v)] = vector(rule, cfg.targets, lambda name, window: sig, max_num_seqs=daemon.alerting.max_num_seqs)
        return v

    assert exported() == waiting / 4 and alert_value() == waiting / 4  # the managed config's max_num_seqs: 4
    # An apply raised it to 8 and was kept: the limit in force is now 8, whatever the config says.
    jr.save_managed(
        store.engine,
        jr.ManagedState(
            target="v",
            pid=None,
            proc_start=None,
            argv=[],
            flags={"max_num_seqs": 8},
            config_flags={"max_num_seqs": 4},
            started_ms=0,
            restarts=[],
            state="running",
            updated_ms=0,
            note="",
        ),
    )
    assert exported() == waiting / 8 and alert_value() == waiting / 8


def test_memory_breakdown_on_metrics_and_in_status_json(store, tmp_path):
    """A managed vLLM target serving the recorded tiny model's /metrics: its KV cache from cache_config_info (16384
    blocks of 128 tokens x 512 B), weights and overhead from the memory model over its model's config, and the GPU
    memory of its processes. No GPU here, so the reading is made by hand as NVML's reading maps into it (pynvml
    cannot run without a GPU: its mapping is tested against a stand-in in tests/collect/test_gpu.py); the server's
    process is a real one, recorded as the managed server, found with its process group."""
    import subprocess
    import sys

    from tests.helpers import FIXTURES
    from tuner.advise.facts import load_model
    from tuner.advise.memory import weights_bytes
    from tuner.app.session import Session
    from tuner.app.status import status
    from tuner.apply.managed import proc_start_time
    from tuner.collect.snapshots import GpuProcess, GpuReading, GpuSnapshot
    from tuner.store import journal as jr

    text = fixture_text("vllm-0.32-cpu/metrics_idle.txt")
    model_dir = FIXTURES / "models" / "tiny-llama"
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        with ReplayServer(ReplayExposition(text, growth=0.0)) as replay:
            cfg = parse_config(
                f"targets:\n  - name: v\n    backend: vllm\n    url: '{replay.url}'\n"
                f"    managed: {{model: '{model_dir}', executable: /opt/vllm/bin/python}}\n"
            )
            now = time.time()
            jr.save_managed(
                store.engine,
                jr.ManagedState(
                    target="v",
                    pid=server.pid,
                    proc_start=proc_start_time(server.pid),
                    argv=[],
                    flags={},
                    config_flags={},
                    started_ms=int(now * 1000),
                    restarts=[],
                    state="running",
                    updated_ms=int(now * 1000),
                    note="",
                ),
            )
            gib = 2**30
            store.ingest_gpu(
                GpuReading(
                    "nvml",
                    now,
                    True,
                    (
                        GpuSnapshot(
                            0,
                            "GPU-0",
                            "NVIDIA H100 80GB HBM3",
                            0.4,
                            70 * gib,
                            80 * gib,
                            50.0,
                            300.0,
                            (GpuProcess(server.pid, "python", 60 * gib), GpuProcess(1, "someone-else", 10 * gib)),
                        ),
                    ),
                )
            )
            daemon = Daemon(cfg, store, config_dir=tmp_path)
            for _ in range(2):
                daemon.scraping.scrape_once(cfg.targets[0])
            daemon.signals_once()
            daemon.applying.status_once()
            st = status(Session(cfg, tmp_path, store), window_s=300, now=time.time())
        httpd, _ = serve_metrics(daemon.state, "127.0.0.1", 0)
        try:
            body = http.get(
                f"http://127.0.0.1:{httpd.server_address[1]}/metrics", timeout_s=5, max_bytes=2**22
            ).body.decode()
        finally:
            httpd.shutdown()
    finally:
        server.kill()
        server.wait()
    got = _samples(body)
    eng = (("engine", "0"), ("model_name", "tiny-llama"), ("target", "v"))
    assert got[("tuner_memory_kv_cache_allocated_bytes", eng)] == 16384 * 128 * 512 == 2**30
    assert got[("tuner_memory_kv_cache_used_bytes", eng)] == 0.0  # idle
    assert got[("tuner_memory_weights_bytes", eng)] == weights_bytes(load_model(model_dir))
    assert got[("tuner_memory_overhead_bytes", eng)] > 2**30
    proc = (("gpu", "0"), ("name", "python"), ("pid", str(server.pid)), ("target", "v"))
    assert got[("tuner_memory_gpu_process_used_bytes", proc)] == 60 * gib
    assert got[("tuner_memory_gpu_total_bytes", (("gpu", "0"), ("target", "v")))] == 80 * gib
    assert not [k for k in got if k[0] == "tuner_memory_gpu_process_used_bytes" and ("pid", "1") in k[1]]
    assert (
        got[("tuner_applies_last_hour", (("target", "v"),))] == 0
        and ("tuner_apply_flag_flips", (("target", "v"),)) in got
    )
    (row,) = st.targets
    (mem,) = row.as_json()["memory"]
    assert mem["kv_cache_allocated_bytes"] == 2**30 and mem["kv_source"] == "blocks"
    assert mem["gpu_processes"] == [
        {"gpu": 0, "pid": server.pid, "name": "python", "used_bytes": 60 * gib, "total_bytes": 80 * gib}
    ]
