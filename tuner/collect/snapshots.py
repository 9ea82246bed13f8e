"""Plain data handed from the collectors to everything downstream.

Storage, signals, rules and the advisor read these, never exposition text. Field comments state units.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tuner.collect.catalogue import LLAMACPP, SLOTS, VLLM

__all__ = [
    "Labels",
    "SeriesKey",
    "Histogram",
    "EngineSnapshot",
    "SlotsState",
    "TargetSnapshot",
    "GpuProcess",
    "GpuSnapshot",
    "GpuReading",
]

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs, hashable
SeriesKey = tuple[str, Labels]  # (canonical metric name, labels other than engine/model_name)

# Snapshot field → canonical metric, per backend (both backends have e.g. prompt_tokens_total).
_FIELDS = {
    "vllm": {s.field: s.name for s in VLLM if s.field},
    "llamacpp": {s.field: s.name for s in LLAMACPP + SLOTS if s.field},
}
_IN_FLIGHT = {
    "vllm": ("requests_running", "requests_waiting"),
    "llamacpp": ("requests_processing", "requests_deferred"),
}


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram as scraped: ``counts[i]`` observations were <= ``bounds[i]``."""

    bounds: tuple[float, ...]  # upper bounds ascending; the last is +Inf
    counts: tuple[float, ...]  # cumulative counts, same length as bounds
    sum: float  # sum of observations, in the metric's unit
    count: float  # number of observations (equals counts[-1] on a healthy server)


@dataclass(frozen=True)
class EngineSnapshot:
    """One engine/model behind an endpoint at one scrape.

    ``values`` holds every counter and gauge tuner keeps, keyed by canonical name and extra labels;
    the properties below are the ones other stages (and the ``tuner snapshot`` contract) rely on.
    """

    backend: Literal["vllm", "llamacpp"]
    engine: str  # vLLM's engine index label; "0" for llama-server
    model_name: str
    values: Mapping[SeriesKey, float]
    histograms: Mapping[SeriesKey, Histogram]
    config: Mapping[str, str] = field(default_factory=dict)  # vllm:cache_config_info labels, or llama /props

    def total(self, metric: str) -> float | None:
        """Sum of a counter/gauge over its extra labels; None when the server did not serve it."""
        found = [v for (name, _), v in self.values.items() if name == metric]
        return math.fsum(found) if found else None

    def histogram(self, metric: str) -> Histogram | None:
        return self.histograms.get((metric, ()))

    def field(self, name: str) -> float | None:
        return self.total(_FIELDS[self.backend][name])

    @property
    def kv_cache_usage(self) -> float | None:  # fraction 0-1
        return self.field("kv_cache_usage")

    @property
    def requests_running(self) -> float | None:
        """Requests being decoded now (llama-server: processing), as the signals name them."""
        return self.field(_IN_FLIGHT[self.backend][0])

    @property
    def requests_waiting(self) -> float | None:
        """Requests queued for a slot (llama-server: deferred)."""
        return self.field(_IN_FLIGHT[self.backend][1])

    def as_json(self) -> dict[str, Any]:
        """The ``tuner snapshot --json`` object: every catalogue field this backend served."""
        out: dict[str, Any] = {"backend": self.backend, "engine": self.engine, "model_name": self.model_name}
        for fname, metric in _FIELDS[self.backend].items():
            value = self.total(metric)
            if value is not None:
                out[fname] = value
        if self.backend == "vllm":
            out["config"] = dict(self.config)
        return out


@dataclass(frozen=True)
class SlotsState:
    """llama-server's /slots, summarized. KV use is derived: upstream removed its KV gauge."""

    slots_total: int
    slots_busy: int
    slot_context_tokens: int  # n_ctx of one slot (-c is split across --parallel slots)
    kv_tokens_in_use: int  # prompt + generated tokens held by busy slots (each at most its n_ctx)

    @property
    def kv_cache_usage(self) -> float:  # fraction 0-1 of the whole context
        total = self.slots_total * self.slot_context_tokens
        return self.kv_tokens_in_use / total if total else 0.0


@dataclass(frozen=True)
class TargetSnapshot:
    """Everything one scrape of one target produced. ``problems`` are recorded with the scrape."""

    target: str
    backend: Literal["vllm", "llamacpp"]
    ts: float  # unix seconds when the scrape started
    duration_s: float  # how long the scrape took
    engines: tuple[EngineSnapshot, ...]
    problems: tuple[str, ...] = ()  # non-fatal: samples dropped or read with assumptions
    body_bytes: int = 0
    slots: SlotsState | None = None
    healthy: bool | None = None  # /health answered 200 (None: not asked)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str  # process name, "" when it cannot be read
    used_memory_bytes: int | None  # None when the driver does not say


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU at one reading."""

    index: int
    uuid: str
    name: str
    utilization: float | None  # fraction 0-1 of time a kernel ran
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperature_c: float | None
    power_w: float | None
    processes: tuple[GpuProcess, ...] = ()

    @property
    def memory_used_ratio(self) -> float | None:  # fraction 0-1
        if self.memory_used_bytes is None or not self.memory_total_bytes:
            return None
        return self.memory_used_bytes / self.memory_total_bytes


@dataclass(frozen=True)
class GpuReading:
    """All GPUs from one source at one time. ``available`` False is the clean "no GPU here" state."""

    source: Literal["nvml", "dcgm", "none"]
    ts: float  # unix seconds
    available: bool
    gpus: tuple[GpuSnapshot, ...] = ()
    reason: str = ""  # why no GPU could be read, when available is False
