"""The Grafana dashboards, built in code with grafana-foundation-sdk (Grafana 11.6 schema).

Four dashboards, each over a Prometheus datasource chosen by the ``$datasource`` variable:

- ``tuner-vllm``: vLLM's own series (names of vLLM 0.32, tests/fixtures/vllm-0.32-cpu/);
- ``tuner-gpu``: tuner's ``tuner_gpu_*`` and dcgm-exporter's ``DCGM_FI_DEV_*``;
- ``tuner-llama-server``: llama-server's ``llamacpp:*`` plus tuner's slot view of it;
- ``tuner-self``: tuner itself (targets, scrapes, alerts, recommendations, applies).

Series are filtered by ``target`` (the label tuner's exporter puts on its series; for a server's own
series, give Prometheus the same label, as ``tuner alerts export`` assumes) and ``model_name``. Both
variables allow "All" (``.*``), which also matches series without the label.
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef, VariableRefresh, VariableSort

from tuner.names import (
    LLAMACPP_N_BUSY_SLOTS_PER_DECODE,
    LLAMACPP_N_DECODE_TOTAL,
    LLAMACPP_PREDICTED_TOKENS_SECONDS,
    LLAMACPP_PROMPT_TOKENS_SECONDS,
    LLAMACPP_PROMPT_TOKENS_TOTAL,
    LLAMACPP_REQUESTS_DEFERRED,
    LLAMACPP_REQUESTS_PROCESSING,
    LLAMACPP_TOKENS_PREDICTED_TOTAL,
    VLLM_E2E_REQUEST_LATENCY_SECONDS,
    VLLM_GENERATION_TOKENS_TOTAL,
    VLLM_INTER_TOKEN_LATENCY_SECONDS,
    VLLM_KV_CACHE_USAGE_PERC,
    VLLM_NUM_PREEMPTIONS_TOTAL,
    VLLM_NUM_REQUESTS_RUNNING,
    VLLM_NUM_REQUESTS_WAITING,
    VLLM_PREFIX_CACHE_HITS_TOTAL,
    VLLM_PREFIX_CACHE_QUERIES_TOTAL,
    VLLM_PROMPT_TOKENS_TOTAL,
    VLLM_REQUEST_QUEUE_TIME_SECONDS,
    VLLM_REQUEST_SUCCESS_TOTAL,
    VLLM_TIME_TO_FIRST_TOKEN_SECONDS,
)
from tuner.rules.state import AlertState
from tuner.store.journal import ApplyOutcome

__all__ = ["build_dashboards", "to_json", "RATE", "PENDING_SERIES"]

# Series a dashboard may read before tuner's exporter serves them (a contract not landed yet); the tests accept
# exactly these as missing and fail once they are served. Empty: everything read is served.
PENDING_SERIES: frozenset[str] = frozenset()

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
TARGET = 'target=~"$target"'
VLLM = 'target=~"$target",model_name=~"$model"'  # vLLM series and tuner's per-engine series
BY = "target, model_name"
QUANTILES = (0.5, 0.95, 0.99)


class _Layout:
    """Places panels left to right on Grafana's 24-column grid, rows top to bottom."""

    def __init__(self, dash: db.Dashboard) -> None:
        self.dash, self.x, self.y, self.row_h, self.next_id = dash, 0, 0, 0, 1

    def row(self, title: str) -> None:
        self._newline()
        self.dash.with_row(db.Row(title).id(self._id()))
        self.y += 1

    def add(self, panel: Any, w: int = 12, h: int = 8) -> None:
        if self.x + w > 24:
            self._newline()
        self.dash.with_panel(panel.id(self._id()).datasource(DS).span(w).height(h))
        self.x += w
        self.row_h = max(self.row_h, h)

    def _newline(self) -> None:
        if self.x:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def _q(expr: str, legend: str = "", ref: str = "A") -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref)
    return q.legend_format(legend) if legend else q


def _ts(title: str, unit: str, *queries: prometheus.Dataquery, description: str = "") -> timeseries.Panel:
    p = timeseries.Panel().title(title).unit(unit)
    if description:
        p = p.description(description)
    for q in queries:
        p = p.with_target(q)
    return p


def _refs(*pairs: tuple[str, str]) -> list[prometheus.Dataquery]:
    return [_q(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def _quantiles(histogram: str, sel: str = VLLM, by: str = BY) -> list[prometheus.Dataquery]:
    return _refs(
        *[
            (
                f"histogram_quantile({q}, sum by ({by}, le) (rate({histogram}_bucket{{{sel}}}[{RATE}])))",
                f"P{round(q * 100)} {{{{target}}}} {{{{model_name}}}}",
            )
            for q in QUANTILES
        ]
    )


def _dashboard(uid: str, title: str, description: str, tags: list[str]) -> db.Dashboard:
    return (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["tuner", *tags])
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .editable()
        .with_variable(db.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    )


def _var(name: str, label: str, query: str) -> db.QueryVariable:
    return (
        db.QueryVariable(name)
        .label(label)
        .datasource(DS)
        .query(query)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )


def _events(dash: db.Dashboard) -> db.Dashboard:
    """Applies, rollbacks and firing alerts as annotations (from tuner's exporter)."""
    for name, color, expr in (
        ("Applies kept", "green", f'increase(tuner_applies_total{{{TARGET},outcome="{ApplyOutcome.KEPT}"}}[2m]) > 0'),
        ("Rollbacks", "red", f'increase(tuner_applies_total{{{TARGET},outcome=~"rolled_back|failed"}}[2m]) > 0'),
        ("Alerts firing", "orange", f'tuner_alerts{{{TARGET},alertstate="{AlertState.FIRING}"}}'),
    ):
        dash = dash.annotation(db.AnnotationQuery().name(name).datasource(DS).enable(True).icon_color(color).expr(expr))
    return dash


def vllm_overview() -> db.Dashboard:
    d = _dashboard(
        "tuner-vllm",
        "vLLM overview",
        "vLLM's own /metrics: queue, KV cache, latency percentiles, "
        "throughput, prefix cache, preemptions, finish reasons; goodput from tuner.",
        ["vllm"],
    )
    d = _events(
        d.with_variable(_var("target", "Target", f"label_values({VLLM_NUM_REQUESTS_RUNNING}, target)")).with_variable(
            _var("model", "Model", f"label_values({VLLM_NUM_REQUESTS_RUNNING}{{{TARGET}}}, model_name)")
        )
    )
    lay = _Layout(d)
    lay.row("Load")
    lay.add(
        _ts(
            "Requests running / waiting",
            "short",
            *_refs(
                (f"sum by ({BY}) ({VLLM_NUM_REQUESTS_RUNNING}{{{VLLM}}})", "running {{target}} {{model_name}}"),
                (f"sum by ({BY}) ({VLLM_NUM_REQUESTS_WAITING}{{{VLLM}}})", "waiting {{target}} {{model_name}}"),
            ),
        )
    )
    lay.add(
        _ts(
            "KV-cache use",
            "percentunit",
            _q(f"max by ({BY}) ({VLLM_KV_CACHE_USAGE_PERC}{{{VLLM}}})", "{{target}} {{model_name}}"),
        )
        .min(0)
        .max(1)
    )
    lay.add(
        _ts(
            "Requests waiting / max-num-seqs (tuner)",
            "short",
            _q(f"tuner_queue_to_max_num_seqs_ratio{{{VLLM}}}", "{{target}} {{model_name}}"),
            description="Above 1: more requests wait than the server runs at once (the flags in force)",
        ),
        w=8,
    )
    lay.add(
        _ts(
            "Stalled requests",
            "short",
            _q(
                f"(sum by ({BY}) ({VLLM_NUM_REQUESTS_RUNNING}{{{VLLM}}}) + "
                f"sum by ({BY}) ({VLLM_NUM_REQUESTS_WAITING}{{{VLLM}}}))"
                f" * on ({BY}) (sum by ({BY}) (increase({VLLM_GENERATION_TOKENS_TOTAL}{{{VLLM}}}[1m])) + sum by ({BY}) "
                f"(increase({VLLM_REQUEST_SUCCESS_TOTAL}{{{VLLM}}}[1m])) == bool 0)",
                "{{target}} {{model_name}}",
            ),
            description="Requests in flight while not one token was generated and no request finished in the last "
            "minute: the engine is stuck while the server answers (EngineStalled)",
        ),
        w=8,
    )
    lay.add(
        _ts(
            "Process restarts",
            "short",
            _q(f"changes(process_start_time_seconds{{{TARGET}}}[10m])", "{{target}}"),
            description="Times the server's process start time changed in the last 10 minutes",
        ),
        w=8,
    )
    lay.row("Latency")
    lay.add(_ts("Time to first token", "s", *_quantiles(VLLM_TIME_TO_FIRST_TOKEN_SECONDS)), w=8)
    lay.add(_ts("Inter-token latency", "s", *_quantiles(VLLM_INTER_TOKEN_LATENCY_SECONDS)), w=8)
    lay.add(_ts("End-to-end latency", "s", *_quantiles(VLLM_E2E_REQUEST_LATENCY_SECONDS)), w=8)
    lay.add(_ts("Queue time", "s", *_quantiles(VLLM_REQUEST_QUEUE_TIME_SECONDS)), w=8)
    lay.add(
        _ts(
            "Goodput (tuner, share of requests within the SLO)",
            "percentunit",
            _q(f"tuner_goodput_ratio{{{VLLM}}}", "{{target}} {{model_name}}"),
        )
        .min(0)
        .max(1),
        w=8,
    )
    lay.add(
        _ts(
            "Token goodput (tuner, generated tokens/s of requests within the SLO)",
            "short",
            *_refs(
                (f"tuner_goodput_tokens_per_second{{{VLLM}}}", "within the SLO {{target}} {{model_name}}"),
                (
                    f"sum by ({BY}) (rate({VLLM_GENERATION_TOKENS_TOTAL}{{{VLLM}}}[{RATE}]))",
                    "all {{target}} {{model_name}}",
                ),
            ),
            description="Generated tokens per second times the share of requests within every SLO budget, beside all "
            "generated tokens per second",
        ),
        w=8,
    )
    lay.row("Throughput")
    lay.add(
        _ts(
            "Tokens per second",
            "short",
            *_refs(
                (
                    f"sum by ({BY}) (rate({VLLM_PROMPT_TOKENS_TOTAL}{{{VLLM}}}[{RATE}]))",
                    "prompt {{target}} {{model_name}}",
                ),
                (
                    f"sum by ({BY}) (rate({VLLM_GENERATION_TOKENS_TOTAL}{{{VLLM}}}[{RATE}]))",
                    "generated {{target}} {{model_name}}",
                ),
            ),
        )
    )
    lay.add(
        _ts(
            "Finished requests per second, by reason",
            "reqps",
            _q(
                f"sum by ({BY}, finished_reason) (rate({VLLM_REQUEST_SUCCESS_TOTAL}{{{VLLM}}}[{RATE}]))",
                "{{finished_reason}} {{target}} {{model_name}}",
            ),
        )
    )
    lay.add(
        _ts(
            "Prefix-cache hit rate",
            "percentunit",
            _q(
                f"sum by ({BY}) (rate({VLLM_PREFIX_CACHE_HITS_TOTAL}{{{VLLM}}}[{RATE}])) / "
                f"sum by ({BY}) (rate({VLLM_PREFIX_CACHE_QUERIES_TOTAL}{{{VLLM}}}[{RATE}]))",
                "{{target}} {{model_name}}",
            ),
            description="Share of queried prompt tokens found in the prefix cache",
        )
        .min(0)
        .max(1)
    )
    lay.add(
        _ts(
            "Preemptions",
            "short",
            _q(
                f"sum by ({BY}) (increase({VLLM_NUM_PREEMPTIONS_TOTAL}{{{VLLM}}}[{RATE}]))", "{{target}} {{model_name}}"
            ),
            description="Requests preempted (KV cache full) per rate interval",
        )
    )
    lay.row("Memory")
    lay.add(
        _ts(
            "Memory per GPU: weights, KV cache, overhead (tuner)",
            "bytes",
            *_refs(
                (f"tuner_memory_weights_bytes{{{VLLM}}}", "weights {{target}} {{model_name}}"),
                (f"tuner_memory_kv_cache_used_bytes{{{VLLM}}}", "KV cache in use {{target}} {{model_name}}"),
                (
                    f"tuner_memory_kv_cache_allocated_bytes{{{VLLM}}} - tuner_memory_kv_cache_used_bytes{{{VLLM}}}",
                    "KV cache free {{target}} {{model_name}}",
                ),
                (f"tuner_memory_overhead_bytes{{{VLLM}}}", "overhead {{target}} {{model_name}}"),
            ),
            description="KV cache from the server's cache_config_info and KV use; weights and overhead from tuner's "
            "memory model, for the targets tuner knows the model of (managed)",
        ).stacking(_stacked())
    )
    lay.add(
        _ts(
            "GPU memory of the server's processes (NVML)",
            "bytes",
            *_refs(
                (f"tuner_memory_gpu_process_used_bytes{{{TARGET}}}", "pid {{pid}} {{name}} GPU {{gpu}} {{target}}"),
                (f"tuner_memory_gpu_total_bytes{{{TARGET}}}", "GPU {{gpu}} total {{target}}"),
            ),
            description="What NVML says each of a managed server's processes uses, against the GPU's total",
        )
    )
    return d


def gpu() -> db.Dashboard:
    d = _dashboard(
        "tuner-gpu",
        "GPU",
        "GPU utilization, memory, temperature and power: tuner's tuner_gpu_* "
        "(NVML or dcgm-exporter, read by tuner) and dcgm-exporter's own DCGM_FI_DEV_* series.",
        ["gpu"],
    )
    d = d.with_variable(_var("gpu", "GPU", "label_values(tuner_gpu_utilization_ratio, gpu)"))
    g = 'gpu=~"$gpu"'
    lay = _Layout(d)
    lay.row("Read by tuner (tuner_gpu_*)")
    lay.add(
        _ts("Utilization", "percentunit", _q(f"tuner_gpu_utilization_ratio{{{g}}}", "GPU {{gpu}} {{name}}"))
        .min(0)
        .max(1)
    )
    lay.add(
        _ts(
            "Memory used",
            "bytes",
            *_refs(
                (f"tuner_gpu_memory_used_bytes{{{g}}}", "used GPU {{gpu}}"),
                (f"tuner_gpu_memory_total_bytes{{{g}}}", "total GPU {{gpu}}"),
            ),
        )
    )
    lay.add(_ts("Temperature", "celsius", _q(f"tuner_gpu_temperature_celsius{{{g}}}", "GPU {{gpu}}")), w=8)
    lay.add(_ts("Power", "watt", _q(f"tuner_gpu_power_watts{{{g}}}", "GPU {{gpu}}")), w=8)
    lay.add(
        _ts(
            "Processes on the GPU",
            "short",
            _q(f"tuner_gpu_processes{{{g}}}", "GPU {{gpu}}"),
            description="More than the server itself means the GPU is shared",
        ),
        w=8,
    )
    lay.row("dcgm-exporter (DCGM_FI_DEV_*)")
    lay.add(_ts("Utilization", "percent", _q(f"DCGM_FI_DEV_GPU_UTIL{{{g}}}", "GPU {{gpu}} {{Hostname}}")))
    lay.add(
        _ts(
            "Framebuffer used",
            "decmbytes",
            *_refs(
                (f"DCGM_FI_DEV_FB_USED{{{g}}}", "used GPU {{gpu}} {{Hostname}}"),
                (f"DCGM_FI_DEV_FB_USED{{{g}}} + DCGM_FI_DEV_FB_FREE{{{g}}}", "used + free GPU {{gpu}} {{Hostname}}"),
            ),
        )
    )
    lay.add(_ts("Temperature", "celsius", _q(f"DCGM_FI_DEV_GPU_TEMP{{{g}}}", "GPU {{gpu}} {{Hostname}}")))
    lay.add(_ts("Power", "watt", _q(f"DCGM_FI_DEV_POWER_USAGE{{{g}}}", "GPU {{gpu}} {{Hostname}}")))
    return d


def llama_server() -> db.Dashboard:
    d = _dashboard(
        "tuner-llama-server",
        "llama-server",
        "llama.cpp llama-server's --metrics series and tuner's "
        "view of its /slots (slots busy, KV use derived from the slots).",
        ["llama-server"],
    )
    d = _events(d.with_variable(_var("target", "Target", "label_values(tuner_target_up, target)")))
    lay = _Layout(d)
    lay.row("Slots and queue")
    lay.add(
        _ts(
            "Requests processing / deferred",
            "short",
            *_refs(
                (f"sum by (target) ({LLAMACPP_REQUESTS_PROCESSING}{{{TARGET}}})", "processing {{target}}"),
                (f"sum by (target) ({LLAMACPP_REQUESTS_DEFERRED}{{{TARGET}}})", "deferred {{target}}"),
            ),
        )
    )
    lay.add(
        _ts(
            "Slots busy / total (tuner, from /slots)",
            "short",
            *_refs(
                (f'tuner_slots_busy{{{TARGET},backend="llamacpp"}}', "busy {{target}}"),
                (f'tuner_slots{{{TARGET},backend="llamacpp"}}', "total {{target}}"),
            ),
        )
    )
    lay.add(
        _ts(
            "KV use (tuner, from /slots)",
            "percentunit",
            _q(f'tuner_kv_cache_usage_ratio{{{TARGET},backend="llamacpp"}}', "{{target}}"),
        )
        .min(0)
        .max(1)
    )
    lay.add(_ts("Busy slots per decode", "short", _q(f"{LLAMACPP_N_BUSY_SLOTS_PER_DECODE}{{{TARGET}}}", "{{target}}")))
    lay.row("Throughput")
    lay.add(
        _ts(
            "Tokens per second",
            "short",
            *_refs(
                (f"sum by (target) (rate({LLAMACPP_PROMPT_TOKENS_TOTAL}{{{TARGET}}}[{RATE}]))", "prompt {{target}}"),
                (
                    f"sum by (target) (rate({LLAMACPP_TOKENS_PREDICTED_TOTAL}{{{TARGET}}}[{RATE}]))",
                    "generated {{target}}",
                ),
            ),
        )
    )
    lay.add(
        _ts(
            "Server-reported speed",
            "short",
            *_refs(
                (f"{LLAMACPP_PROMPT_TOKENS_SECONDS}{{{TARGET}}}", "prompt tokens/s {{target}}"),
                (f"{LLAMACPP_PREDICTED_TOKENS_SECONDS}{{{TARGET}}}", "generated tokens/s {{target}}"),
            ),
            description="llama-server's own averages since start",
        )
    )
    lay.add(
        _ts(
            "Decode calls per second",
            "short",
            _q(f"sum by (target) (rate({LLAMACPP_N_DECODE_TOTAL}{{{TARGET}}}[{RATE}]))", "{{target}}"),
        )
    )
    return d


def tuner_self() -> db.Dashboard:
    d = _dashboard(
        "tuner-self",
        "tuner",
        "tuner itself: target health, scrapes, alerts, recommendations; applies and rollbacks as annotations.",
        ["self"],
    )
    d = _events(d.with_variable(_var("target", "Target", "label_values(tuner_target_up, target)")))
    lay = _Layout(d)
    lay.row("Targets")
    lay.add(stat.Panel().title("Targets up").with_target(_q(f"sum(tuner_target_up{{{TARGET}}})")), w=6, h=4)
    lay.add(
        stat.Panel().title("Targets down").with_target(_q(f"count(tuner_target_up{{{TARGET}}} == 0) or vector(0)")),
        w=6,
        h=4,
    )
    lay.add(
        stat.Panel()
        .title("Alerts firing")
        .with_target(_q(f'count(tuner_alerts{{{TARGET},alertstate="{AlertState.FIRING}"}}) or vector(0)')),
        w=6,
        h=4,
    )
    lay.add(stat.Panel().title("Notifications queued").with_target(_q("tuner_alert_notifications_queued")), w=6, h=4)
    lay.add(
        _ts(
            "Target health",
            "short",
            _q(f"tuner_target_health{{{TARGET}}} == 1", "{{target}} {{health}}"),
            description="One line per target in its current state: up, degraded (samples dropped) or down",
        )
    )
    lay.add(_ts("Scrape duration", "s", _q(f"tuner_scrape_duration_seconds{{{TARGET}}}", "{{target}}")))
    lay.add(
        _ts(
            "Scrapes and failures per second",
            "short",
            *_refs(
                (f"sum by (target) (rate(tuner_scrapes_total{{{TARGET}}}[{RATE}]))", "scrapes {{target}}"),
                (f"sum by (target) (rate(tuner_scrape_failures_total{{{TARGET}}}[{RATE}]))", "failures {{target}}"),
            ),
        )
    )
    lay.add(
        _ts("Consecutive failed scrapes", "short", _q(f"tuner_scrape_consecutive_failures{{{TARGET}}}", "{{target}}"))
    )
    lay.add(
        _ts(
            "Scrape errors per minute",
            "short",
            *_refs(
                (f"sum by (target) (rate(tuner_scrape_failures_total{{{TARGET}}}[5m])) * 60", "{{target}}"),
                ("sum(rate(tuner_scrape_failures_total[5m])) * 60", "all targets"),
            ),
            description="Failed scrapes per minute over 5 minutes, per target and all together (ScrapeErrorsHigh, "
            "ScrapeErrorsHighOverall)",
        )
    )
    lay.add(
        _ts(
            "Server /health and scrapes",
            "short",
            *_refs(
                (f"tuner_target_server_healthy{{{TARGET}}}", "/health 200 {{target}}"),
                (f"tuner_target_up{{{TARGET}}}", "scrape stored {{target}}"),
            ),
            description="1 when the server's /health answered 200, and when the last scrape stored data: /health up "
            "with scrapes failing is llama-server's stuck slot loop (EngineStalled)",
        )
    )
    lay.row("Alerts")
    lay.add(
        table.Panel()
        .title("Active alerts")
        .with_target(_q(f"tuner_alerts{{{TARGET}}}").instant().format(_table_format())),
        w=24,
    )
    lay.add(
        _ts(
            "Alerts by name and state",
            "short",
            _q(f"count by (alertname, alertstate) (tuner_alerts{{{TARGET}}})", "{{alertname}} {{alertstate}}"),
        )
    )
    lay.add(
        _ts(
            "Jobs failing (rules reload, notify, store, gpu)",
            "short",
            _q("count(tuner_job_error == 1) or vector(0)", "jobs failing"),
        )
    )
    lay.add(
        _ts(
            "Alertmanager outbox",
            "short",
            _q("tuner_alert_notifications_queued", "notifications queued"),
            description="Notifications waiting to be taken by an Alertmanager (AlertOutboxGrowing)",
        )
    )
    lay.row("Recommendations and applies")
    lay.add(
        _ts(
            "Recommendations by status",
            "short",
            _q(f"sum by (target, status) (tuner_recommendations{{{TARGET}}})", "{{status}} {{target}}"),
        )
    )
    lay.add(
        _ts(
            "Applies by outcome",
            "short",
            _q(f"sum by (target, outcome) (increase(tuner_applies_total{{{TARGET}}}[1h]))", "{{outcome}} {{target}}"),
            description="Applies finished in the last hour: kept, rolled_back or failed",
        )
    )
    lay.add(
        _ts(
            "Applies in the last hour and flag flips",
            "short",
            *_refs(
                (f"tuner_applies_last_hour{{{TARGET}}}", "applies in the last hour {{target}}"),
                (f"tuner_apply_flag_flips{{{TARGET}}}", "flag flips in 24 h {{target}}"),
            ),
            description="Applies, rollbacks and restarts begun in the last hour (ApplyThrashing); times a flag went "
            "back to its value before its last change (FlagFlapping)",
        )
    )
    lay.add(
        _ts(
            "Auto mode",
            "short",
            *_refs(
                (
                    f"(time() - tuner_auto_last_evaluation_timestamp_seconds{{{TARGET}}}) / "
                    f"tuner_auto_interval_seconds{{{TARGET}}}",
                    "intervals since its last evaluation {{target}}",
                ),
                (f"tuner_auto_apply_halted{{{TARGET}}}", "halted {{target}}"),
            ),
            description="Auto mode's intervals since it last evaluated the target (AutoLoopStalled) and whether it "
            "halted itself after rollbacks (AutoApplyHalted)",
        )
    )
    return d


def _stacked():
    from grafana_foundation_sdk.builders.common import StackingConfig
    from grafana_foundation_sdk.models.common import StackingMode

    return StackingConfig().mode(StackingMode.NORMAL)


def _table_format():
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

    return PromQueryFormat.TABLE


def build_dashboards() -> dict[str, dict[str, Any]]:
    """uid → dashboard JSON model (plain dicts), in a stable order."""
    out = {}
    for make in (vllm_overview, gpu, llama_server, tuner_self):
        model = json.loads(to_json(make().build()))
        out[model["uid"]] = model
    return out


def to_json(model: Any) -> str:
    return json.dumps(model, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
