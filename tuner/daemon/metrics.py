"""tuner's own ``/metrics``: per-target health and the derived signals, so Prometheus and Grafana see tuner's view.

Served by prometheus_client on 127.0.0.1 unless ``listen`` says otherwise. Values come from the
daemon's state (refreshed by its signals job); the collector only reads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tuner.daemon.http_api import serve
from tuner.daemon.state import DaemonState
from tuner.names import VLLM_CACHE_CONFIG_INFO
from tuner.signals.derive import LATENCY_HISTOGRAMS, QUANTILES, queue_ratio
from tuner.store.alerts import outbox_size
from tuner.store.journal import OUTCOMES
from tuner.store.recommendations import STATUSES

__all__ = ["TunerCollector", "serve_metrics", "SIGNAL_GAUGES"]

# EngineSignals field → (metric name, help). Units in the names, Prometheus style.
SIGNAL_GAUGES = {
    "kv_cache_usage": ("tuner_kv_cache_usage_ratio", "KV-cache use, fraction 0-1 (llama-server: derived from /slots)"),
    "kv_cache_usage_max": ("tuner_kv_cache_usage_max_ratio", "Highest KV-cache use in the signal window"),
    "requests_running": ("tuner_requests_running", "Requests running (llama-server: processing)"),
    "requests_waiting": ("tuner_requests_waiting", "Requests waiting (llama-server: deferred)"),
    "prompt_tokens_per_s": ("tuner_prompt_tokens_per_second", "Prompt tokens per second over the window"),
    "generation_tokens_per_s": ("tuner_generation_tokens_per_second", "Generated tokens per second over the window"),
    "requests_per_s": ("tuner_requests_per_second", "Finished requests per second over the window"),
    "preemptions_per_s": ("tuner_preemptions_per_second", "Preemptions per second over the window"),
    "prefix_cache_hit_ratio": (
        "tuner_prefix_cache_hit_ratio",
        "Share of queried prompt tokens found in the prefix cache",
    ),
    "goodput_ratio": ("tuner_goodput_ratio", "Share of requests within every SLO budget (lower bound)"),
    "token_goodput_per_s": (
        "tuner_goodput_tokens_per_second",
        "Generated tokens per second x the share of requests within every SLO budget",
    ),
    "stalled_requests": (
        "tuner_stalled_requests",
        "Requests in flight when no token was generated and no request finished in the window",
    ),
    "slots_total": ("tuner_slots", "llama-server slots"),
    "slots_busy": ("tuner_slots_busy", "llama-server slots processing a request"),
}
_HEALTH = ("up", "degraded", "down")


def _own_loop_families(
    targets: list[str], thrash: dict[str, int], flips: dict[str, int], alive: dict[str, float], every: dict[str, float]
) -> Iterator[Metric]:
    """tuner's own loop: what the rules over it read (apply thrash, flag flips, auto mode's last evaluation)."""
    last_hour = GaugeMetricFamily(
        "tuner_applies_last_hour", "Applies, rollbacks and restarts begun in the last hour", labels=["target"]
    )
    flipped = GaugeMetricFamily(
        "tuner_apply_flag_flips",
        "Times in 24 hours a flag in force went back to its value before its last change",
        labels=["target"],
    )
    for t in targets:
        last_hour.add_metric([t], float(thrash.get(t, 0)))
        flipped.add_metric([t], float(flips.get(t, 0)))
    yield last_hour
    yield flipped
    last = GaugeMetricFamily(
        "tuner_auto_last_evaluation_timestamp_seconds",
        "When auto mode last evaluated the target, or was busy applying (unix seconds)",
        labels=["target"],
    )
    interval = GaugeMetricFamily(
        "tuner_auto_interval_seconds", "Seconds between auto mode's evaluations", labels=["target"]
    )
    for t, ts in sorted(alive.items()):
        last.add_metric([t], ts)
        if t in every:
            interval.add_metric([t], every[t])
    yield last
    yield interval


_MEMORY = {  # MemoryBreakdown field -> (metric, help)
    "weights_bytes": ("tuner_memory_weights_bytes", "Weights at run time, per GPU (the memory model; managed targets)"),
    "kv_cache_allocated_bytes": (
        "tuner_memory_kv_cache_allocated_bytes",
        f"KV cache the server allocated, per GPU ({VLLM_CACHE_CONFIG_INFO})",
    ),
    "kv_cache_used_bytes": ("tuner_memory_kv_cache_used_bytes", "KV cache in use: allocated x KV-cache use"),
    "overhead_bytes": (
        "tuner_memory_overhead_bytes",
        "Runtime overhead per GPU: context, allocator, graphs, one step's activations (the memory model)",
    ),
}


def _memory_families(memory: dict[str, list[Any]]) -> Iterator[Metric]:
    """Where each vLLM server's memory goes (app/memory.py), and NVML's used memory of each of its processes."""
    labels = ["target", "engine", "model_name"]
    fams = {f: GaugeMetricFamily(m, h, labels=labels) for f, (m, h) in _MEMORY.items()}
    used = GaugeMetricFamily(
        "tuner_memory_gpu_process_used_bytes",
        "GPU memory a process of the server uses (NVML)",
        labels=["target", "gpu", "pid", "name"],
    )
    total = GaugeMetricFamily(
        "tuner_memory_gpu_total_bytes", "Total memory of a GPU the server's processes use", labels=["target", "gpu"]
    )
    for name, engines in sorted(memory.items()):
        gpus: dict[int, int | None] = {}
        procs = {}  # (gpu, pid) -> process: the server's, whichever of its engines it is listed with
        for em in engines:
            for f, fam in fams.items():
                v = getattr(em.breakdown, f)
                if v is not None:
                    fam.add_metric([name, em.engine, em.model_name], float(v))
            procs.update({(p.gpu, p.pid): p for p in em.gpu_processes})
        for (gpu, pid), p in sorted(procs.items()):
            if p.used_bytes is not None:
                used.add_metric([name, str(gpu), str(pid), p.name], float(p.used_bytes))
            gpus[gpu] = p.total_bytes
        for gpu, size in sorted(gpus.items()):
            if size is not None:
                total.add_metric([name, str(gpu)], float(size))
    yield from fams.values()
    yield used
    yield total


def _apply_families(
    targets: list[str],
    rec_counts: dict[tuple[str, str], int],
    apply_counts: dict[tuple[str, str], int],
    managed_up: dict[str, bool],
    auto_halted: dict[str, bool],
) -> Iterator[Metric]:
    recs = GaugeMetricFamily("tuner_recommendations", "Stored recommendations by status", labels=["target", "status"])
    for t in targets:
        for status in STATUSES:
            recs.add_metric([t, status], float(rec_counts.get((t, status), 0)))
    yield recs
    applies = CounterMetricFamily(
        "tuner_applies",
        "Finished applies by outcome (kept, rolled_back, inconclusive, failed; unchanged: a tuning run on the target)",
        labels=["target", "outcome"],
    )
    for t in targets:
        for outcome in OUTCOMES:
            applies.add_metric([t, outcome], float(apply_counts.get((t, outcome), 0)))
    yield applies
    up = GaugeMetricFamily("tuner_managed_server_up", "1 if the server tuner manages is running", labels=["target"])
    for t, v in sorted(managed_up.items()):
        up.add_metric([t], float(v))
    yield up
    halted = GaugeMetricFamily(
        "tuner_auto_apply_halted", "1 when auto mode stopped after rollbacks in a row", labels=["target"]
    )
    for t, v in sorted(auto_halted.items()):
        halted.add_metric([t], float(v))
    yield halted


class TunerCollector(Collector):
    def __init__(self, state: DaemonState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        with self.state.lock:
            signals = dict(self.state.signals)
            scrapes = dict(self.state.scrapes_total)
            failures = dict(self.state.scrape_failures_total)
            durations = dict(self.state.last_duration_s)
            gpu = self.state.gpu
            targets = dict(self.state.targets)
            alerting = self.state.alerting
            job_errors = dict(self.state.job_errors)
            rec_counts = dict(self.state.recommendations)
            apply_counts = dict(self.state.applies)
            managed_up = dict(self.state.managed_up)
            auto_halted = dict(self.state.auto_halted)
            max_num_seqs = dict(self.state.max_num_seqs)
            thrash, flips = dict(self.state.applies_last_hour), dict(self.state.flag_flips)
            alive, every = dict(self.state.auto_alive), dict(self.state.auto_every)
            memory = dict(self.state.memory)
        up = GaugeMetricFamily("tuner_target_up", "1 if the last scrape of the target stored data", labels=["target"])
        health = GaugeMetricFamily(
            "tuner_target_health", "1 for the target's current health state", labels=["target", "health"]
        )
        dur = GaugeMetricFamily("tuner_scrape_duration_seconds", "Duration of the last scrape", labels=["target"])
        fails = GaugeMetricFamily("tuner_scrape_consecutive_failures", "Failed scrapes in a row", labels=["target"])
        total = CounterMetricFamily("tuner_scrapes", "Scrapes attempted since tuner started", labels=["target"])
        failed = CounterMetricFamily(
            "tuner_scrape_failures", "Scrapes that failed since tuner started", labels=["target"]
        )
        for name in sorted(set(signals) | set(scrapes)):
            h = signals[name].health if name in signals else None
            if h is not None:
                up.add_metric([name], 0.0 if h.health == "down" else 1.0)
                for state in _HEALTH:
                    health.add_metric([name, state], 1.0 if h.health == state else 0.0)
                fails.add_metric([name], h.consecutive_failures)
            if name in durations:
                dur.add_metric([name], durations[name])
            total.add_metric([name], scrapes.get(name, 0))
            failed.add_metric([name], failures.get(name, 0))
        yield from (up, health, dur, fails, total, failed)
        errs = GaugeMetricFamily(
            "tuner_job_error", "1 while a job's last run failed (rules reload, notify, store)", labels=["job"]
        )
        for job, error in sorted(job_errors.items()):
            if error:
                errs.add_metric([job], 1.0)
        yield errs

        srv = GaugeMetricFamily(
            "tuner_target_server_healthy", "1 if the server's /health answered 200", labels=["target"]
        )
        for name, sig in sorted(signals.items()):
            if sig.health is not None and sig.health.server_healthy is not None:
                srv.add_metric([name], float(sig.health.server_healthy))
        yield srv

        labels = ["target", "engine", "model_name", "backend"]
        gauges = {f: GaugeMetricFamily(m, h, labels=labels) for f, (m, h) in SIGNAL_GAUGES.items()}
        queue = GaugeMetricFamily(
            "tuner_queue_to_max_num_seqs_ratio",
            "Requests waiting / the max-num-seqs the target runs with",
            labels=labels,
        )
        lat = {
            p: GaugeMetricFamily(
                f"tuner_{p}_seconds", f"{p.upper()} quantile over the window, from {h}", labels=[*labels, "quantile"]
            )
            for p, h in LATENCY_HISTOGRAMS.items()
        }
        for name, sig in sorted(signals.items()):
            limit = max_num_seqs.get(name)  # the flags in force, refreshed by the daemon's apply-status job
            for e in sig.engines:
                key = [name, e.engine, e.model_name, sig.backend]
                for f, fam in gauges.items():
                    v = getattr(e, f)
                    if v is not None:
                        fam.add_metric(key, v)
                if (ratio := queue_ratio(e, limit)) is not None:
                    queue.add_metric(key, ratio)
                for p, fam in lat.items():
                    for q in QUANTILES:
                        v = getattr(e, f"{p}_p{round(q * 100)}")
                        if v is not None:
                            fam.add_metric([*key, str(q)], v)
        yield from gauges.values()
        yield queue
        yield from lat.values()

        yield from _apply_families(list(targets), rec_counts, apply_counts, managed_up, auto_halted)
        yield from _own_loop_families(list(targets), thrash, flips, alive, every)
        yield from _memory_families(memory)

        if alerting is not None:
            alerts = GaugeMetricFamily(
                "tuner_alerts",
                "Active alerts (1 per alert), like Prometheus's ALERTS",
                labels=["alertname", "alertstate", "target", "severity"],
            )
            for a in alerting.active():
                alerts.add_metric(
                    [a.labels.get("alertname", ""), a.state, a.labels.get("target", ""), a.labels.get("severity", "")],
                    1.0,
                )
            yield alerts
            out = GaugeMetricFamily("tuner_alert_notifications_queued", "Notifications waiting in the outbox")
            out.add_metric([], float(outbox_size(alerting.store)))
            yield out

        if gpu is not None:
            avail = GaugeMetricFamily(
                "tuner_gpu_telemetry_available", "1 if GPU telemetry could be read", labels=["source"]
            )
            avail.add_metric([gpu.source], 1.0 if gpu.available else 0.0)
            yield avail
            glabels = ["gpu", "uuid", "name"]
            fams = {
                "utilization": GaugeMetricFamily(
                    "tuner_gpu_utilization_ratio", "GPU busy fraction 0-1", labels=glabels
                ),
                "memory_used_bytes": GaugeMetricFamily(
                    "tuner_gpu_memory_used_bytes", "GPU memory used", labels=glabels
                ),
                "memory_total_bytes": GaugeMetricFamily(
                    "tuner_gpu_memory_total_bytes", "GPU memory total", labels=glabels
                ),
                "temperature_c": GaugeMetricFamily("tuner_gpu_temperature_celsius", "GPU temperature", labels=glabels),
                "power_w": GaugeMetricFamily("tuner_gpu_power_watts", "GPU power draw", labels=glabels),
            }
            procs = GaugeMetricFamily("tuner_gpu_processes", "Processes using the GPU", labels=glabels)
            for g in gpu.gpus:
                key = [str(g.index), g.uuid, g.name]
                for f, fam in fams.items():
                    v = getattr(g, f)
                    if v is not None:
                        fam.add_metric(key, float(v))
                procs.add_metric(key, len(g.processes))
            yield from fams.values()
            yield procs


def serve_metrics(
    state: DaemonState, host: str, port: int, *, daemon: object | None = None, token: str | None = None
) -> tuple[object, object]:
    """Start tuner's listener (/metrics; with ``daemon`` also /api/v1, see http_api.py) in a thread.

    Returns (server, thread) for shutdown.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TunerCollector(state))
    return serve(registry, host, port, daemon=daemon, token=token)
