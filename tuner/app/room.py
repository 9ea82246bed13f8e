"""Room on this host for a second server of a target beside the one running: tune's shadow trials and blue/green
applies ask. The host's available memory (/proc/meminfo) for servers on the CPU, the GPU's free memory (the last
telemetry) for vLLM on a GPU, with the memory model's sizes for what the second server would take."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tuner.advise.facts import gpu_facts, load_model
from tuner.advise.memory import GIB, weights_bytes
from tuner.app.recommend import host_available_bytes, vllm_cpu_memory
from tuner.apply.servers import flags_in_force
from tuner.config import Target
from tuner.errors import ConfigError
from tuner.store.store import Store
from tuner.tune.space import Hardware, canonical, feasible

__all__ = ["hardware", "shadow_fits", "second_server"]

_CPU_SERVER_OVERHEAD = int(1.5 * GIB)  # a vLLM CPU server's own RSS beyond weights and KV (measured here: ~1.2 GiB)


def hardware(store: Store, t: Target, now: float) -> tuple[Hardware, dict[str, Any]]:
    gpu = gpu_facts(store.gpu_latest(max_age_s=120.0, now=now))
    if gpu.vendor != "none" and gpu.memory_total_bytes:
        free = gpu.memory_total_bytes - (gpu.memory_used_bytes or 0)
        facts = {"kind": "gpu", "gpu": gpu.name, "free_bytes": free}
        return Hardware(gpu_memory_bytes=gpu.memory_total_bytes, gpu_name=gpu.name or ""), facts
    assert t.managed is not None
    if t.backend != "vllm":  # llama-server on the host: a trial server may take what production leaves, less a fifth
        have = host_available_bytes()
        return Hardware(host_memory_bytes=int(0.8 * have) if have else None), {"kind": "cpu", "host_available": have}
    space = t.managed.env.get("VLLM_CPU_KVCACHE_SPACE") or os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    if not space:
        return _kv_by_utilization(store, t)
    try:
        kv = int(float(space) * GIB)
    except ValueError:
        raise ConfigError(
            "config", f"targets[{t.name}].managed.env.VLLM_CPU_KVCACHE_SPACE", f"{space!r}: expected GiB as a number"
        ) from None
    return Hardware(cpu_kv_cache_bytes=kv), {"kind": "cpu", "kv_cache_bytes": kv}


def _kv_by_utilization(store: Store, t: Target) -> tuple[Hardware, dict[str, Any]]:
    """vLLM's CPU backend without VLLM_CPU_KVCACHE_SPACE: the worker claims --gpu-memory-utilization of the host's
    memory as it counts it, and its KV cache is what is left of that after the worker's own
    (vllm/v1/worker/cpu_worker.py); a second worker starts only if that claim is available."""
    assert t.managed is not None
    util = float(canonical(flags_in_force(store.engine, t)).get("gpu_memory_utilization") or 0.9)
    memory = vllm_cpu_memory()
    if memory is None:
        raise ConfigError(
            "config",
            f"targets[{t.name}].managed.env.VLLM_CPU_KVCACHE_SPACE",
            "unset, and the host's memory cannot be read (/proc/meminfo): give the KV cache's GiB there",
        )
    total, available = memory
    model = load_model(t.managed.model) if Path(t.managed.model).exists() else None
    kv = max(0, int(util * total) - (weights_bytes(model) if model is not None else 0) - _CPU_SERVER_OVERHEAD)
    return Hardware(cpu_kv_cache_bytes=kv), {
        "kind": "cpu",
        "kv_cache_bytes": kv,
        "claims_bytes": int(util * total),
        "available_bytes": available,
        "sized_by": f"--gpu-memory-utilization {util:g} of the host's {total / GIB:.1f} GiB (VLLM_CPU_KVCACHE_SPACE "
        "unset)",
    }


def shadow_fits(t: Target, hw: Hardware, where: dict[str, Any], model: Any, *, servers: int = 1) -> tuple[bool, str]:
    """Whether ``servers`` more servers fit beside production (shadow mode: tune's comparison in turns asks for two)."""
    if where["kind"] == "gpu":
        return False, (
            "a second vLLM does not fit beside production on this GPU (each takes its "
            "--gpu-memory-utilization share); run with --on-target inside a maintenance window"
        )
    if t.backend != "vllm":  # each candidate's memory is checked on its own (tuner/tune/space.py)
        have = where.get("host_available")
        if servers > 1:  # each candidate's own memory is known only to feasible(); llama-server restarts in < 1 s
            return False, "one llama-server at a time (each candidate's memory is checked on its own)"
        return (
            have is not None,
            f"the host has {have / GIB:.2f} GiB available; each candidate must fit 80% of it"
            if have is not None
            else "cannot read the host's available memory (/proc/meminfo)",
        )
    need = servers * (
        (weights_bytes(model) if model is not None else 0) + (hw.cpu_kv_cache_bytes or 0) + _CPU_SERVER_OVERHEAD
    )
    have = where["available_bytes"] if "sized_by" in where else host_available_bytes()  # as vLLM counts it
    if have is None:
        return False, "cannot read the host's available memory (/proc/meminfo)"
    ok = need <= 0.8 * have
    sized = (
        f"; KV space sized by {where['sized_by']}: set managed.env.VLLM_CPU_KVCACHE_SPACE"
        if "sized_by" in where
        else ""
    )
    return ok, (
        f"{'a trial server needs' if servers == 1 else f'{servers} trial servers need'} ~{need / GIB:.2f} GiB "
        f"(weights + KV space + {_CPU_SERVER_OVERHEAD / GIB:.1f} "
        f"GiB of runtime); the host has {have / GIB:.2f} GiB available{sized if not ok else ''}"
    )


def second_server(store: Store, t: Target, flags: dict[str, Any], now: float) -> tuple[bool, str]:
    """Whether a second server of managed target ``t`` with ``flags`` fits beside the running one: (fits, why)."""
    assert t.managed is not None
    model = load_model(t.managed.model) if Path(t.managed.model).exists() else None
    hw, where = hardware(store, t, now)
    if where["kind"] == "gpu":  # vLLM starts only if its share of the whole GPU is free when it starts
        share = float(canonical(flags).get("gpu_memory_utilization") or 0.9)
        need, free = share * (hw.gpu_memory_bytes or 0), where["free_bytes"]
        return need <= free, (
            f"--gpu-memory-utilization {share:g} needs {need / GIB:.1f} GiB of {where['gpu']}; "
            f"{free / GIB:.1f} GiB are free"
        )
    if t.backend != "vllm":
        if hw.host_memory_bytes is None:
            return False, "cannot read the host's available memory (/proc/meminfo)"
        v = feasible(t.backend, flags, model=model, hardware=hw, longest=1)
        return v.ok, f"a second llama-server: {v.reason}"
    return shadow_fits(t, hw, where, model)
