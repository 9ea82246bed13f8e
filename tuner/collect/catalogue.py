"""Every metric name tuner reads, in one table, with the aliases older servers used.

A sample name found on the wire is looked up here and turned into a canonical series name (what the
store keeps) plus which part of it the sample is (plain value, histogram bucket, count or sum). Names
not in the table are ignored: tuner keeps what its signals need, not the whole exposition.
``tests/collect/test_catalogue.py`` proves each entry against recorded real expositions.
The canonical vLLM and llama-server names are spelled once, in ``tuner/names.py`` (below every layer, so the rules,
the advisor and backends.py read them too); an alias an older server used is spelled only here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tuner import names as n

__all__ = [
    "MetricSpec",
    "Kind",
    "Part",
    "VLLM",
    "LLAMACPP",
    "DCGM",
    "SLOTS",
    "lookup",
    "spec",
    "ALL_SPECS",
    "ENGINE_LABELS",
]

Kind = Literal["counter", "gauge", "histogram", "info"]
Part = Literal["value", "bucket", "count", "sum"]

# Labels that identify an engine inside one endpoint; every other label is part of the series key.
ENGINE_LABELS = ("engine", "model_name")


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its canonical name, kind, unit, and the snapshot field it feeds (if any)."""

    name: str  # canonical; counters keep their _total suffix, histograms are the base name
    kind: Kind
    unit: str  # "seconds", "tokens", "requests", "ratio" (0-1), "bytes", "celsius", "watts", "info", ...
    backend: Literal["vllm", "llamacpp", "dcgm", "slots"]
    field: str | None = None  # key in `tuner snapshot --json`; summed over extra labels
    aliases: tuple[str, ...] = ()  # older names for the same series
    required: bool = False  # a real server of this backend always serves it (checked by tests)


def _v(
    name: str, kind: Kind, unit: str, field: str | None = None, aliases: tuple[str, ...] = (), required: bool = True
) -> MetricSpec:
    return MetricSpec(name, kind, unit, "vllm", field, aliases, required)


VLLM: tuple[MetricSpec, ...] = (
    # scheduler state
    _v(n.VLLM_NUM_REQUESTS_RUNNING, "gauge", "requests", "requests_running"),
    _v(n.VLLM_NUM_REQUESTS_WAITING, "gauge", "requests", "requests_waiting"),
    _v(n.VLLM_NUM_REQUESTS_WAITING_BY_REASON, "gauge", "requests"),
    _v(n.VLLM_KV_CACHE_USAGE_PERC, "gauge", "ratio", "kv_cache_usage", aliases=("vllm:gpu_cache_usage_perc",)),
    _v(n.VLLM_ENGINE_SLEEP_STATE, "gauge", "state"),
    # counters
    _v(n.VLLM_NUM_PREEMPTIONS_TOTAL, "counter", "preemptions", "preemptions_total"),
    _v(n.VLLM_PROMPT_TOKENS_TOTAL, "counter", "tokens", "prompt_tokens_total"),
    _v(n.VLLM_GENERATION_TOKENS_TOTAL, "counter", "tokens", "generation_tokens_total"),
    _v(n.VLLM_PROMPT_TOKENS_CACHED_TOTAL, "counter", "tokens", "prompt_tokens_cached_total", required=False),
    _v(
        n.VLLM_PREFIX_CACHE_QUERIES_TOTAL,
        "counter",
        "tokens",
        "prefix_cache_queries_total",
        aliases=("vllm:gpu_prefix_cache_queries_total",),
    ),
    _v(
        n.VLLM_PREFIX_CACHE_HITS_TOTAL,
        "counter",
        "tokens",
        "prefix_cache_hits_total",
        aliases=("vllm:gpu_prefix_cache_hits_total",),
    ),
    _v(n.VLLM_REQUEST_SUCCESS_TOTAL, "counter", "requests", "requests_finished_total"),
    _v(n.VLLM_ADMISSION_REJECTIONS_TOTAL, "counter", "requests", required=False),
    # latency histograms (seconds)
    _v(n.VLLM_TIME_TO_FIRST_TOKEN_SECONDS, "histogram", "seconds"),
    _v(n.VLLM_INTER_TOKEN_LATENCY_SECONDS, "histogram", "seconds", aliases=("vllm:time_per_output_token_seconds",)),
    _v(n.VLLM_REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS, "histogram", "seconds", required=False),
    _v(n.VLLM_E2E_REQUEST_LATENCY_SECONDS, "histogram", "seconds"),
    _v(n.VLLM_REQUEST_QUEUE_TIME_SECONDS, "histogram", "seconds"),
    _v(n.VLLM_REQUEST_INFERENCE_TIME_SECONDS, "histogram", "seconds"),
    _v(n.VLLM_REQUEST_PREFILL_TIME_SECONDS, "histogram", "seconds"),
    _v(n.VLLM_REQUEST_DECODE_TIME_SECONDS, "histogram", "seconds"),
    # size histograms (tokens)
    _v(n.VLLM_REQUEST_PROMPT_TOKENS, "histogram", "tokens"),
    _v(n.VLLM_REQUEST_GENERATION_TOKENS, "histogram", "tokens"),
    _v(n.VLLM_ITERATION_TOKENS_TOTAL, "histogram", "tokens"),
    _v(n.VLLM_REQUEST_MAX_NUM_GENERATION_TOKENS, "histogram", "tokens", required=False),
    _v(n.VLLM_REQUEST_PARAMS_MAX_TOKENS, "histogram", "tokens", required=False),
    _v(n.VLLM_REQUEST_NUM_PREEMPTIONS, "histogram", "preemptions", required=False),
    # live engine config, as labels
    _v(n.VLLM_CACHE_CONFIG_INFO, "info", "info"),
    # the API server's answers by route and status class: a 4xx on /v1/... is how vLLM refuses a prompt longer than
    # its max-model-len (no vllm: counter sees it); the workload reads it (tuner/signals/workload.py)
    MetricSpec("http_requests_total", "counter", "requests", "vllm"),
    # process (API server) start time: a change means the server restarted
    MetricSpec("process_start_time_seconds", "gauge", "seconds", "vllm", "process_start_time_seconds"),
)


def _l(name: str, kind: Kind, unit: str, field: str | None = None, required: bool = True) -> MetricSpec:
    return MetricSpec(name, kind, unit, "llamacpp", field, (), required)


LLAMACPP: tuple[MetricSpec, ...] = (
    _l(n.LLAMACPP_PROMPT_TOKENS_TOTAL, "counter", "tokens", "prompt_tokens_total"),
    _l(n.LLAMACPP_PROMPT_TOKENS_CACHED_TOTAL, "counter", "tokens", "prompt_tokens_cached_total", required=False),
    _l(n.LLAMACPP_PROMPT_SECONDS_TOTAL, "counter", "seconds", "prompt_seconds_total"),
    _l(n.LLAMACPP_TOKENS_PREDICTED_TOTAL, "counter", "tokens", "tokens_predicted_total"),
    _l(n.LLAMACPP_TOKENS_PREDICTED_SECONDS_TOTAL, "counter", "seconds", "tokens_predicted_seconds_total"),
    _l(n.LLAMACPP_N_DECODE_TOTAL, "counter", "calls", "n_decode_total"),
    _l(n.LLAMACPP_N_TOKENS_MAX, "counter", "tokens", "n_tokens_max"),  # declared counter, is a running max
    _l(n.LLAMACPP_SPEC_DECODE_NUM_DRAFT_TOKENS_TOTAL, "counter", "tokens", required=False),
    _l(n.LLAMACPP_SPEC_DECODE_NUM_ACCEPTED_TOKENS_TOTAL, "counter", "tokens", required=False),
    _l(n.LLAMACPP_SPEC_DECODE_NUM_DRAFTS_TOTAL, "counter", "calls", required=False),
    _l(n.LLAMACPP_PROMPT_TOKENS_SECONDS, "gauge", "tokens_per_second", "prompt_tokens_seconds"),
    _l(n.LLAMACPP_PREDICTED_TOKENS_SECONDS, "gauge", "tokens_per_second", "predicted_tokens_seconds"),
    _l(n.LLAMACPP_REQUESTS_PROCESSING, "gauge", "requests", "requests_processing"),
    _l(n.LLAMACPP_REQUESTS_DEFERRED, "gauge", "requests", "requests_deferred"),
    _l(n.LLAMACPP_N_BUSY_SLOTS_PER_DECODE, "gauge", "slots", "n_busy_slots_per_decode"),
    # removed upstream; still read from older servers
    _l(n.LLAMACPP_KV_CACHE_USAGE_RATIO, "gauge", "ratio", required=False),
    _l(n.LLAMACPP_KV_CACHE_TOKENS, "gauge", "tokens", required=False),
)

# Derived by tuner from llama-server's /slots (upstream has no KV gauge any more).
SLOTS: tuple[MetricSpec, ...] = (
    MetricSpec("tuner:slots_total", "gauge", "slots", "slots", "slots_total"),
    MetricSpec("tuner:slots_busy", "gauge", "slots", "slots", "slots_busy"),
    MetricSpec("tuner:slot_context_tokens", "gauge", "tokens", "slots", "slot_context_tokens"),
    MetricSpec("tuner:kv_tokens_in_use", "gauge", "tokens", "slots", "kv_tokens_in_use"),
    MetricSpec("tuner:kv_cache_usage", "gauge", "ratio", "slots", "kv_cache_usage"),
)

DCGM: tuple[MetricSpec, ...] = (
    MetricSpec("DCGM_FI_DEV_GPU_UTIL", "gauge", "percent", "dcgm"),
    MetricSpec("DCGM_FI_DEV_FB_USED", "gauge", "mebibytes", "dcgm"),
    MetricSpec("DCGM_FI_DEV_FB_FREE", "gauge", "mebibytes", "dcgm"),
    MetricSpec("DCGM_FI_DEV_POWER_USAGE", "gauge", "watts", "dcgm"),
    MetricSpec("DCGM_FI_DEV_GPU_TEMP", "gauge", "celsius", "dcgm"),
)

ALL_SPECS: tuple[MetricSpec, ...] = VLLM + LLAMACPP + SLOTS + DCGM
_BY_NAME = {s.name: s for s in ALL_SPECS}

# Prefixes other deployments put before vLLM's own (Ray Serve's metrics re-export).
_PREFIXES = {"ray_vllm:": n.VLLM_PREFIX, "ray_vllm_": n.VLLM_PREFIX}


def _wire_names() -> dict[str, tuple[MetricSpec, Part]]:
    table: dict[str, tuple[MetricSpec, Part]] = {}
    for s in ALL_SPECS:
        for name in (s.name, *s.aliases):
            if s.kind == "histogram":
                table[name + "_bucket"] = (s, "bucket")
                table[name + "_count"] = (s, "count")
                table[name + "_sum"] = (s, "sum")
            else:
                table[name] = (s, "value")
    return table


_WIRE = _wire_names()


def lookup(sample_name: str) -> tuple[MetricSpec, Part] | None:
    """The spec and part for a sample name seen on the wire, or None if tuner does not keep it."""
    hit = _WIRE.get(sample_name)
    if hit is None:
        for prefix, canonical in _PREFIXES.items():
            if sample_name.startswith(prefix):
                return _WIRE.get(canonical + sample_name[len(prefix) :])
    return hit


def spec(name: str) -> MetricSpec:
    """The spec for a canonical name; KeyError names the unknown metric."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in tuner's metric catalogue") from None
