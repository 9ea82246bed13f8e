"""The signals a rule may test, where each value comes from, and the PromQL that says the same thing.

An engine signal is a field of EngineSignals (one value per target/engine/model); a target signal
has one value per target; a GPU signal one per GPU; a tuner signal one for the whole tuner (its own loop).
Signals in SELF_SIGNALS come from tuner's own state (its journal, counters and outbox: signals/selfwatch.py),
not from the servers' scrapes. ``promql`` is the expression a Prometheus that
scrapes the same servers evaluates for the exported rule: over vLLM's own metric names where one
exists, else over tuner's exported ``tuner_*`` series. ``{sel}`` takes label matchers, ``{w}`` the
window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tuner.names import (
    VLLM_E2E_REQUEST_LATENCY_SECONDS,
    VLLM_GENERATION_TOKENS_TOTAL,
    VLLM_INTER_TOKEN_LATENCY_SECONDS,
    VLLM_KV_CACHE_USAGE_PERC,
    VLLM_NUM_PREEMPTIONS_TOTAL,
    VLLM_NUM_REQUESTS_RUNNING,
    VLLM_NUM_REQUESTS_WAITING,
    VLLM_PREFIX_CACHE_HITS_TOTAL,
    VLLM_PREFIX_CACHE_QUERIES_TOTAL,
    VLLM_REQUEST_QUEUE_TIME_SECONDS,
    VLLM_REQUEST_SUCCESS_TOTAL,
    VLLM_TIME_TO_FIRST_TOKEN_SECONDS,
)

__all__ = ["SignalSpec", "SIGNALS", "SELF_SIGNALS", "known_signals", "signal_spec"]

Scope = Literal["engine", "target", "gpu", "tuner"]
ENGINE_BY = "target, engine, model_name"


@dataclass(frozen=True)
class SignalSpec:
    name: str
    scope: Scope
    unit: str
    help: str
    promql: dict[str, str]  # backend ("vllm" | "llamacpp" | "any") -> expression template


def _hq(q: float, hist: str) -> str:
    return f"histogram_quantile({q}, sum by ({ENGINE_BY}, le) (increase({hist}_bucket{{sel}}[{{w}}])))"


def _tuner(series: str) -> str:
    return f"max by ({ENGINE_BY}) ({series}{{sel}})"


_LAT = {
    "ttft": VLLM_TIME_TO_FIRST_TOKEN_SECONDS,
    "itl": VLLM_INTER_TOKEN_LATENCY_SECONDS,
    "e2e": VLLM_E2E_REQUEST_LATENCY_SECONDS,
    "queue": VLLM_REQUEST_QUEUE_TIME_SECONDS,
}

_SPECS: list[SignalSpec] = [
    SignalSpec(
        "kv_cache_usage",
        "engine",
        "ratio",
        "KV-cache use (latest), fraction 0-1",
        {
            "vllm": f"max by ({ENGINE_BY}) ({VLLM_KV_CACHE_USAGE_PERC}{{sel}})",
            "llamacpp": _tuner("tuner_kv_cache_usage_ratio"),
        },
    ),
    SignalSpec(
        "kv_cache_usage_max",
        "engine",
        "ratio",
        "highest KV-cache use in the window",
        {
            "vllm": f"max by ({ENGINE_BY}) (max_over_time({VLLM_KV_CACHE_USAGE_PERC}{{sel}}[{{w}}]))",
            "llamacpp": _tuner("tuner_kv_cache_usage_max_ratio"),
        },
    ),
    SignalSpec(
        "requests_running",
        "engine",
        "requests",
        "requests running (llama-server: processing)",
        {
            "vllm": f"sum by ({ENGINE_BY}) ({VLLM_NUM_REQUESTS_RUNNING}{{sel}})",
            "llamacpp": _tuner("tuner_requests_running"),
        },
    ),
    SignalSpec(
        "requests_waiting",
        "engine",
        "requests",
        "requests waiting (llama-server: deferred)",
        {
            "vllm": f"sum by ({ENGINE_BY}) ({VLLM_NUM_REQUESTS_WAITING}{{sel}})",
            "llamacpp": _tuner("tuner_requests_waiting"),
        },
    ),
    SignalSpec(
        "queue_to_max_num_seqs",
        "engine",
        "ratio",
        "requests waiting / the max-num-seqs the target runs with (the flags in force, not the config key)",
        {"vllm": _tuner("tuner_queue_to_max_num_seqs_ratio")},
    ),
    SignalSpec(
        "preemptions_per_s",
        "engine",
        "per_second",
        "preemptions per second over the window",
        {"vllm": f"sum by ({ENGINE_BY}) (rate({VLLM_NUM_PREEMPTIONS_TOTAL}{{sel}}[{{w}}]))"},
    ),
    SignalSpec(
        "requests_per_s",
        "engine",
        "per_second",
        "finished requests per second over the window",
        {"vllm": f"sum by ({ENGINE_BY}) (rate({VLLM_REQUEST_SUCCESS_TOTAL}{{sel}}[{{w}}]))"},
    ),
    SignalSpec(
        "generation_tokens_per_s",
        "engine",
        "per_second",
        "generated tokens per second",
        {
            "vllm": f"sum by ({ENGINE_BY}) (rate({VLLM_GENERATION_TOKENS_TOTAL}{{sel}}[{{w}}]))",
            "llamacpp": _tuner("tuner_generation_tokens_per_second"),
        },
    ),
    SignalSpec(
        "prefix_cache_hit_ratio",
        "engine",
        "ratio",
        "prefix-cache hits / queries over the window",
        {
            "vllm": f"sum by ({ENGINE_BY}) (increase({VLLM_PREFIX_CACHE_HITS_TOTAL}{{sel}}[{{w}}])) / "
            f"sum by ({ENGINE_BY}) (increase({VLLM_PREFIX_CACHE_QUERIES_TOTAL}{{sel}}[{{w}}]))"
        },
    ),
    SignalSpec(
        "goodput_ratio",
        "engine",
        "ratio",
        "share of requests within every SLO budget (lower bound)",
        {"vllm": _tuner("tuner_goodput_ratio")},
    ),
    SignalSpec(
        "token_goodput_per_s",
        "engine",
        "per_second",
        "generated tokens per second x the share of requests within every SLO budget (lower bound)",
        {"vllm": _tuner("tuner_goodput_tokens_per_second")},
    ),
    SignalSpec(
        "stalled_requests",
        "engine",
        "requests",
        "requests in flight (running + waiting) when no token was generated and no request finished over the "
        "window (llama-server: no llama_decode call); 0 when the engine moved or had nothing to do",
        {
            "vllm": f"(sum by ({ENGINE_BY}) ({VLLM_NUM_REQUESTS_RUNNING}{{sel}}) + sum by ({ENGINE_BY}) "
            f"({VLLM_NUM_REQUESTS_WAITING}{{sel}})) * on ({ENGINE_BY}) (sum by ({ENGINE_BY}) "
            f"(increase({VLLM_GENERATION_TOKENS_TOTAL}{{sel}}[{{w}}])) + sum by ({ENGINE_BY}) "
            f"(increase({VLLM_REQUEST_SUCCESS_TOTAL}{{sel}}[{{w}}])) == bool 0)",
            "llamacpp": _tuner("tuner_stalled_requests"),
        },
    ),
    *[
        SignalSpec(f"{p}_p{q}", "engine", "seconds", f"P{q} of {hist} over the window", {"vllm": _hq(q / 100, hist)})
        for p, hist in _LAT.items()
        for q in (50, 95, 99)
    ],
    SignalSpec(
        "up",
        "target",
        "bool",
        "1 if the last scrape stored data, 0 if it failed",
        {"any": "max by (target) (tuner_target_up{sel})"},
    ),
    SignalSpec(
        "server_healthy",
        "target",
        "bool",
        "1 if the server's /health answered 200 when last asked (vLLM: every health_interval)",
        {"any": "max by (target) (tuner_target_server_healthy{sel})"},
    ),
    SignalSpec(
        "serving_stalled",
        "target",
        "bool",
        "1 when the last scrape failed while the server's /health answered 200 (llama-server answers /metrics "
        "from the loop that runs its slots: a stuck loop still answers /health)",
        {
            "any": "max by (target) (tuner_target_server_healthy{sel}) * on (target) "
            "(1 - max by (target) (tuner_target_up{sel}))"
        },
    ),
    SignalSpec(
        "restarts",
        "target",
        "count",
        "times the server's process start time changed in the window",
        {"vllm": "max by (target) (changes(process_start_time_seconds{sel}[{w}]))"},
    ),
    SignalSpec(
        "auto_apply_halted",
        "target",
        "bool",
        "1 when auto mode stopped applying to the target after max_consecutive_rollbacks in a row",
        {"any": "max by (target) (tuner_auto_apply_halted{sel})"},
    ),
    SignalSpec(
        "applies_per_hour",
        "target",
        "count",
        "applies, rollbacks and restarts begun on the target in the last hour (the journal)",
        {"any": "max by (target) (tuner_applies_last_hour{sel})"},
    ),
    SignalSpec(
        "flag_flips",
        "target",
        "count",
        "times in the last 24 hours a flag in force went back to the value it had before its last change",
        {"any": "max by (target) (tuner_apply_flag_flips{sel})"},
    ),
    SignalSpec(
        "auto_evaluations_missed",
        "target",
        "count",
        "auto mode's intervals since it last evaluated the target (or was busy applying to it)",
        {
            "any": "(time() - max by (target) (tuner_auto_last_evaluation_timestamp_seconds{sel})) / "
            "max by (target) (tuner_auto_interval_seconds{sel})"
        },
    ),
    SignalSpec(
        "scrape_errors_per_minute",
        "target",
        "per_minute",
        "failed scrapes of the target per minute",
        {"any": "sum by (target) (rate(tuner_scrape_failures_total{sel}[{w}])) * 60"},
    ),
    SignalSpec(
        "all_scrape_errors_per_minute",
        "tuner",
        "per_minute",
        "failed scrapes per minute, all targets",
        {"any": "sum(rate(tuner_scrape_failures_total{sel}[{w}])) * 60"},
    ),
    SignalSpec(
        "notifications_queued_growth",
        "tuner",
        "count",
        "notifications in the Alertmanager outbox now, above the fewest it held over the window",
        {
            "any": "max(tuner_alert_notifications_queued{sel}) - "
            "min(min_over_time(tuner_alert_notifications_queued{sel}[{w}]))"
        },
    ),
    SignalSpec(
        "gpu_memory_used_ratio",
        "gpu",
        "ratio",
        "GPU memory used / total",
        {
            "any": "max by (gpu, uuid) (tuner_gpu_memory_used_bytes{sel}) / "
            "max by (gpu, uuid) (tuner_gpu_memory_total_bytes{sel})"
        },
    ),
    SignalSpec(
        "gpu_processes",
        "gpu",
        "count",
        "processes using the GPU",
        {"any": "max by (gpu, uuid) (tuner_gpu_processes{sel})"},
    ),
]

SIGNALS: dict[str, SignalSpec] = {s.name: s for s in _SPECS}

# From tuner's own state, not from scrapes: the daemon hands them to the rules (evaluate.vector's self_signal).
SELF_SIGNALS = frozenset(
    {
        "auto_apply_halted",
        "applies_per_hour",
        "flag_flips",
        "auto_evaluations_missed",
        "scrape_errors_per_minute",
        "all_scrape_errors_per_minute",
        "notifications_queued_growth",
    }
)


def known_signals() -> str:
    return ", ".join(sorted(SIGNALS))


def signal_spec(name: str) -> SignalSpec:
    try:
        return SIGNALS[name]
    except KeyError:
        raise KeyError(f"unknown signal {name!r}; known signals: {known_signals()}") from None
