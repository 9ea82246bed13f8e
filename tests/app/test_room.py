"""Room on this host for a second vLLM CPU server (tuner/app/room.py). Without VLLM_CPU_KVCACHE_SPACE, vLLM's CPU
worker claims --gpu-memory-utilization of the host's memory (vllm/v1/worker/cpu_worker.py; a real server's own log
line is checked against this in tests/integration/test_cpu_kv_sizing_real.py): the memory model used to take 4 GiB
then, and said a second server fitted where vLLM would refuse to start one. The host's memory is injected."""

from __future__ import annotations

import pytest

from tuner.advise.facts import load_model
from tuner.advise.memory import GIB, weights_bytes
from tuner.app import room
from tuner.config import parse_config

MODEL_JSON = (
    '{"architectures": ["LlamaForCausalLM"], "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, '
    '"num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 4096, "max_position_embeddings": 2048}'
)


def _target(tmp_path, managed: str):
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text(MODEL_JSON)
    cfg = parse_config(
        "targets:\n  - name: v\n    backend: vllm\n    url: http://127.0.0.1:9\n"
        f"    managed: {{model: {tmp_path / 'model'}, {managed}}}\n"
    )
    return cfg.targets[0], load_model(tmp_path / "model")


@pytest.fixture
def host(monkeypatch):
    """A 24-GiB host with 20 GiB available."""
    monkeypatch.setattr(room, "vllm_cpu_memory", lambda: (24 * GIB, 20 * GIB))
    monkeypatch.setattr(room, "host_available_bytes", lambda: 20 * GIB)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)


@pytest.mark.parametrize(("flags", "util"), [("{max_num_seqs: 2}", 0.9), ("{gpu_memory_utilization: 0.3}", 0.3)])
def test_without_kv_space_the_worker_claims_its_utilization_of_the_host(tmp_path, store, host, flags, util):
    t, model = _target(tmp_path, f"flags: {flags}")
    hw, where = room.hardware(store, t, now=0.0)
    assert hw.cpu_kv_cache_bytes == int(util * 24 * GIB) - weights_bytes(model) - room._CPU_SERVER_OVERHEAD
    assert (
        where["sized_by"] == f"--gpu-memory-utilization {util:g} of the host's 24.0 GiB (VLLM_CPU_KVCACHE_SPACE unset)"
    )
    fits, why = room.shadow_fits(t, hw, where, model)
    # a second server takes util x 24 GiB in all: 21.6 GiB does not fit 80% of 20; 7.2 GiB does
    assert fits is (util * 24 <= 0.8 * 20)
    assert ("set managed.env.VLLM_CPU_KVCACHE_SPACE" in why) is not fits, why


def test_with_kv_space_set_it_is_the_kv_cache(tmp_path, store, host):
    t, model = _target(tmp_path, "flags: {max_num_seqs: 2}, env: {VLLM_CPU_KVCACHE_SPACE: '2'}")
    hw, where = room.hardware(store, t, now=0.0)
    assert (hw.cpu_kv_cache_bytes, "sized_by" in where) == (2 * GIB, False)
    assert room.shadow_fits(t, hw, where, model)[0]


def test_an_unreadable_host_names_the_key_to_set(tmp_path, store, host, monkeypatch):
    monkeypatch.setattr(room, "vllm_cpu_memory", lambda: None)
    t, _ = _target(tmp_path, "flags: {max_num_seqs: 2}")
    with pytest.raises(Exception, match=r"targets\[v\]\.managed\.env\.VLLM_CPU_KVCACHE_SPACE"):
        room.hardware(store, t, now=0.0)
