"""Where each server's memory goes: weights, KV cache allocated and in use, runtime overhead, and on a GPU what NVML
says each of the server's processes uses of the GPU's total. For `tuner status --json` and tuner's /metrics.

The KV cache comes from the server's own report (vLLM's ``cache_config_info`` and KV use, stored with its scrapes);
weights and overhead from the memory model (advise/memory.py) where tuner knows the model (a managed target's
``managed.model``); the processes from the latest GPU reading, matched to a managed server's process group. A
target tuner does not manage has no processes tuner can name, and its model is not known: those parts are None.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from tuner.advise.facts import load_model
from tuner.advise.memory import MemoryBreakdown, breakdown
from tuner.apply import managed as mg
from tuner.config import Target
from tuner.errors import TunerError
from tuner.names import VLLM_KV_CACHE_USAGE_PERC
from tuner.store import journal as jr
from tuner.store.window import GpuLatest, TargetWindow

__all__ = ["EngineMemory", "GpuProcessMemory", "memory_of", "server_pids"]


@dataclass(frozen=True)
class GpuProcessMemory:
    gpu: int
    pid: int
    name: str
    used_bytes: int | None  # NVML's used GPU memory of the process
    total_bytes: int | None  # the GPU's total memory


@dataclass(frozen=True)
class EngineMemory:
    engine: str
    model_name: str
    breakdown: MemoryBreakdown
    gpu_processes: tuple[GpuProcessMemory, ...] = field(default=())

    def as_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "model_name": self.model_name,
            **self.breakdown.as_json(),
            "gpu_processes": [p.__dict__ for p in self.gpu_processes],
        }


@lru_cache(maxsize=64)
def _model(path: str, mtime: float) -> Any:
    del mtime  # part of the key: a model replaced on disk is read again
    try:
        return load_model(path)
    except TunerError:
        return None


def _model_of(target: Target) -> Any:
    if target.managed is None:
        return None
    path = Path(target.managed.model)
    config = path / "config.json" if path.is_dir() else path
    try:
        return _model(str(path), config.stat().st_mtime)
    except OSError:
        return None


def server_pids(engine: Any, target: Target) -> frozenset[int]:
    """The processes of the managed server tuner runs for ``target`` (empty when it runs none)."""
    if target.managed is None:
        return frozenset()
    st = jr.get_managed(engine, target.name)
    if st is None or not mg.is_alive(st.pid, st.proc_start):
        return frozenset()
    assert st.pid is not None
    return frozenset([st.pid, *mg.group_pids(st.pid)])


def _flag(flags: Mapping[str, Any], name: str) -> Any:
    return flags.get(name, flags.get(name.replace("_", "-")))


def memory_of(
    target: Target, window: TargetWindow, gpus: Iterable[GpuLatest], *, pids: frozenset[int], flags: Mapping[str, Any]
) -> list[EngineMemory]:
    """Each vLLM engine's memory from the newest of ``window`` (its cache_config_info and KV use); ``flags`` the
    flags in force (tensor-parallel size, quantization, batched tokens), ``pids`` the server's processes."""
    if target.backend != "vllm":
        return []
    model = _model_of(target)
    procs = tuple(
        GpuProcessMemory(g.index, pid, name, used, g.memory_total_bytes)
        for g in gpus
        for pid, name, used in g.processes
        if pid in pids
    )
    out = []
    for e in window.engines:
        usage = [pts for (name, _), pts in e.series.items() if name == VLLM_KV_CACHE_USAGE_PERC and pts]
        kv = usage[0][-1][1] if usage else None
        tp, batched = _flag(flags, "tensor_parallel_size"), _flag(flags, "max_num_batched_tokens")
        out.append(
            EngineMemory(
                e.engine,
                e.model_name,
                breakdown(
                    e.config,
                    kv,
                    model,
                    tensor_parallel_size=int(tp) if tp else 1,
                    quantization=_flag(flags, "quantization"),
                    max_num_batched_tokens=int(batched) if batched else None,
                ),
                procs,
            )
        )
    return out
