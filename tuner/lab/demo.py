"""``tuner demo``: tuner's main job, end to end, against a real vLLM it starts itself.

Starts vLLM (CPU build) on a tiny local model, runs ``tuner run`` against it, drives a light then a
heavy load (more concurrent requests than --max-num-seqs, so requests queue), and prints
``tuner status`` and ``tuner signals`` as the numbers move. Everything binds to 127.0.0.1 and
stops by itself.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tuner.apply.launch import ServerProcess, free_port, vllm_argv, vllm_cpu_env
from tuner.collect import http
from tuner.lab.load import LoadResult, run_load

__all__ = ["run_demo"]

MODEL_NAME = "tiny-llama"


def _say(msg: str) -> None:
    print(f"\n=== {msg}", flush=True)


def _tuner(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuner.cli", "--config", str(config), *args],
                          capture_output=True, text=True, timeout=120)


def _show(config: Path, *args: str) -> None:
    proc = _tuner(config, *args)
    print(proc.stdout.rstrip() or proc.stderr.rstrip(), flush=True)


def run_demo(*, vllm_python: str, model: str, workdir: Path, load_scale: float = 1.0) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    port, own_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    config = workdir / "tuner.yaml"
    config.write_text(
        "# written by `tuner demo`\n"
        f"store: {{url: 'sqlite:///{workdir / 'tuner.db'}'}}\n"
        f"listen: 127.0.0.1:{own_port}\n"
        "defaults: {scrape_interval: 2s, scrape_timeout: 2s, signal_window: 1m}\n"
        "gpu: {source: nvml}\n"
        "targets:\n"
        f"  - name: {MODEL_NAME}\n    backend: vllm\n    url: {url}\n"
        "    slo: {ttft_p99: 2s, e2e_p99: 10s}\n")
    _say(f"config {config}")
    print(config.read_text(), end="")
    _say("tuner db upgrade")
    _show(config, "db", "upgrade")

    argv = vllm_argv(vllm_python, model, port=port, served_model_name=MODEL_NAME,
                     flags={"max-model-len": 1024, "max-num-seqs": 4, "enforce-eager": True})
    _say("starting vLLM: " + " ".join(argv))
    server = ServerProcess.start(argv, vllm_cpu_env(workdir / "vllm-cache"), workdir / "vllm.log")
    tuner = None
    try:
        took = server.wait_healthy(url, timeout=600)
        print(f"vLLM healthy after {took:.0f}s (log: {workdir / 'vllm.log'})")
        _say(f"tuner run (own metrics on http://127.0.0.1:{own_port}/metrics)")
        tuner = subprocess.Popen([sys.executable, "-m", "tuner.cli", "--config", str(config), "--log-level",
                                  "WARNING", "run"], stdout=open(workdir / "tuner.log", "w"),
                                 stderr=subprocess.STDOUT)
        time.sleep(3)
        _show(config, "status", "--window", "1m")

        # Long answers (256 tokens) keep each phase going across many 2 s scrapes. The heavy phase queues for
        # ~25 s: on 2 cores a loaded vLLM can miss a scrape's deadline, and several scrapes must see the queue.
        for phase, n, conc in (("light load: 12 requests, 2 at a time", 12, 2),
                               ("heavy load: 128 requests, 16 at a time (max-num-seqs is 4)", 128, 16)):
            _say(phase)
            box: dict[str, LoadResult] = {}
            worker = threading.Thread(target=lambda: box.setdefault("r", run_load(
                url, model=MODEL_NAME, n_requests=max(1, int(n * load_scale)), concurrency=conc,
                prompt_tokens_approx=200, max_tokens=256, timeout_s=300)))
            worker.start()
            time.sleep(5)
            if worker.is_alive():
                print("-- while the load runs:")
                _show(config, "status", "--window", "1m")
            worker.join()
            result = box["r"]
            print(f"-- load done: {result.ok} ok, {result.failed} failed, "
                  f"client P50 {result.quantile(0.5) or 0:.2f}s P99 {result.quantile(0.99) or 0:.2f}s")
            time.sleep(2.5)  # two more scrapes see the end of the phase
            _show(config, "status", "--window", "1m")

        _say("tuner signals tiny-llama --window 1m --json")
        sig = json.loads(_tuner(config, "signals", MODEL_NAME, "--window", "1m", "--json").stdout)
        print(json.dumps(sig["engines"][0], indent=1))
        _say("tuner's own /metrics (excerpt)")
        body = http.get(f"http://127.0.0.1:{own_port}/metrics", timeout_s=5, max_bytes=2**20).body.decode()
        print("\n".join(line for line in body.splitlines()
                        if line.startswith(("tuner_target_up", "tuner_kv_cache", "tuner_ttft_seconds",
                                            "tuner_requests_waiting", "tuner_goodput", "tuner_gpu_telemetry"))))
        return 0
    finally:
        if tuner is not None:
            tuner.send_signal(signal.SIGTERM)
            try:
                tuner.wait(15)
            except subprocess.TimeoutExpired:
                tuner.kill()
        code = server.stop(grace_s=20)
        _say(f"stopped vLLM (exit {code}) and tuner; data kept in {workdir}")
