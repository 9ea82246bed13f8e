"""vLLM's benchmark client against a real llama-server, as `tuner tune` runs it: no request fails on the client's
side. The client keeps connections alive for 60 s and llama-server's HTTP library closes them on its own terms; at
30-45 req/s 1-2% of requests failed "Can not write request body", with --threads-http 64 as well, and none with a
new connection per request (bench/results/2026-11-29-0744-llama-keepalive.md). tuner's client asks for that on
llama-server (tuner/backends.py ``bench_closes_connections``); this holds it to zero failed requests on 900."""

from __future__ import annotations

import realservers
from conftest import require

from tuner.backends import LLAMACPP
from tuner.config import Slo
from tuner.signals.workload import Workload
from tuner.tune.bench import BenchClient


def test_the_client_loses_no_request_to_llama_servers_keep_alive(tmp_path):
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF, realservers.VLLM_PYTHON, realservers.TINY_MODEL)
    server = realservers.start_llama_server(tmp_path / "llama", flags={"-c": 16384, "--parallel": 8, "-ub": 512})
    try:
        w = Workload(input_len=43, output_len=19, range_ratio=0.5, burstiness=0.55)
        client_dir = tmp_path / "client"
        with BenchClient(
            str(realservers.VLLM_PYTHON.path()), client_dir, close_connections=LLAMACPP.bench_closes_connections
        ) as client:
            run = client.run(
                w,
                url=server.url,
                model="tiny",
                tokenizer=str(realservers.TINY_MODEL.path()),
                rate=45.0,
                prompts=900,
                slo=Slo(e2e_p99="20s"),
                timeout_s=600,
            )
    finally:
        server.stop()
    assert run.sent == 900
    assert run.completed == run.sent, f"{run.sent - run.completed} requests failed; see {client_dir}"
