"""The KV cache tuner's memory model gives a vLLM CPU server started without VLLM_CPU_KVCACHE_SPACE, against the one
the real server reports in its own log ("Auto set (X/Y) GiB for KV cache ... with Z GiB requested memory"): vLLM's
CPU worker claims --gpu-memory-utilization of the host's memory, less what the worker itself holds."""

from __future__ import annotations

import re

import realservers
from conftest import require

from tuner.advise.memory import GIB
from tuner.app import room
from tuner.app.recommend import vllm_cpu_memory
from tuner.config import parse_config

_AUTO = re.compile(r"Auto set \(([\d.]+)/([\d.]+)\) GiB for KV cache.*?with ([\d.]+) GiB requested memory")


def test_the_kv_cache_tuner_expects_is_the_one_vllm_sets_itself(tmp_path, store):
    require(realservers.VLLM_PYTHON, realservers.TINY_MODEL)
    util = 0.15  # of this host's memory: small enough to start beside whatever else runs here
    server = realservers.start_vllm(tmp_path / "srv", flags={"gpu-memory-utilization": util})
    try:
        log = server.process.log_path.read_text(errors="replace")
    finally:
        server.stop()
    found = _AUTO.search(log)
    assert found, "vLLM's 'Auto set ... GiB for KV cache' line is missing: " + log[-2000:]
    vllm_kv, vllm_total, requested = (float(x) * GIB for x in found.groups())
    cfg = parse_config(
        "targets:\n  - name: v\n    backend: vllm\n    url: http://127.0.0.1:9\n"
        f"    managed: {{model: {realservers.TINY_MODEL.path()}, flags: {{gpu_memory_utilization: {util}}}}}\n"
    )
    hw, where = room.hardware(store, cfg.targets[0], now=0.0)
    assert "VLLM_CPU_KVCACHE_SPACE unset" in where["sized_by"]
    assert abs(requested - util * vllm_total) < 0.02 * GIB  # what vLLM claims: util x the host's memory
    assert abs(vllm_cpu_memory()[0] - vllm_total) < 0.01 * GIB  # the memory vLLM counts (one VM here: node 0's)
    # tuner's estimate of the worker's own memory (weights + 1.5 GiB) is at least what vLLM measures (0.61 GiB here),
    # so the KV cache tuner expects is never more than vLLM sets, and short of it by at most that estimate
    short = vllm_kv - hw.cpu_kv_cache_bytes
    assert 0 <= short <= room._CPU_SERVER_OVERHEAD, (vllm_kv / GIB, hw.cpu_kv_cache_bytes / GIB)
