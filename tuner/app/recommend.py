"""Recommend: gather the advisor's inputs, let the pure advisor decide, persist what it proposes.

Here, and only here, the advisor's inputs are gathered: the stored window, the GPU reading, the server's version
and live config over HTTP, model files, /proc/meminfo. Then ``tuner.advise.recommend.evaluate`` decides and this
persists. `tuner recommend` and auto mode come through ``recommend``; `tuner tune` seeds its search from
``engine_inputs`` with the flags in force and the model's facts it has read itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.advise.diagnose import Inputs
from tuner.advise.facts import ModelFacts, ServerFacts, flags_from_live_config, gpu_facts, load_model, observe
from tuner.advise.recommend import Outcome, Previous, evaluate
from tuner.apply.servers import flags_in_force
from tuner.collect import http, llamacpp
from tuner.config import Config, Target
from tuner.errors import ConfigError, InputFileError, ModelFactsError, ScrapeError
from tuner.files import read_bytes, read_tail
from tuner.flags import help_flags, parse_version
from tuner.signals.derive import EngineSignals, compute_signals
from tuner.store import recommendations as recs
from tuner.store.store import Store
from tuner.store.window import EngineWindow

__all__ = [
    "RecommendRequest",
    "gather_inputs",
    "engine_inputs",
    "persist",
    "recommend",
    "stored",
    "one",
    "host_available_bytes",
    "vllm_cpu_memory",
]

_HTTP_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class RecommendRequest:
    """What to evaluate: one target over a window, with what the server cannot report given by the caller."""

    target: str
    window_s: float
    # current flags the server does not report, on top of those in force: tuner's names, validated values (the CLI
    # parses its --flag NAME=VALUE into these)
    flags: Mapping[str, Any] = field(default_factory=dict)
    in_force: Mapping[str, Any] | None = None  # the flags in force, where the caller has read them (else read here)
    model: str | None = None  # model dir / config.json / .gguf for the memory model (else the managed model)
    gpu_vendor: str | None = None  # nvidia | amd | none: overrides what NVML implies
    startup_log: str | None = None  # the log of a start that failed
    help_file: str | None = None  # the server's --help output: which flags it supports
    repeated_prefix_share: float | None = None


# ---- gathering live facts ------------------------------------------------------------------------


def _get_json(url: str) -> Any | None:
    try:
        return http.get_json(url, timeout_s=_HTTP_TIMEOUT_S)
    except ScrapeError:
        return None


def _live_server(backend: str, url: str) -> tuple[ServerFacts, dict[str, str]]:
    """The server's version and what its own endpoints say about its flags (empty when it does not answer)."""
    live: dict[str, str] = {}
    if backend == "vllm":
        version = _get_json(f"{url}/version") or {}
        models = _get_json(f"{url}/v1/models") or {}
        data = models.get("data") or [{}]
        if isinstance(data[0], dict) and data[0].get("max_model_len"):
            live["max_model_len"] = str(data[0]["max_model_len"])
        return ServerFacts(version=parse_version(str(version.get("version") or ""))), live
    said = llamacpp.props(url, timeout_s=_HTTP_TIMEOUT_S) or llamacpp.Props(None, None, None, None)
    for key, value in (("total_slots", said.total_slots), ("n_ctx", said.n_ctx), ("model_path", said.model_path)):
        if value is not None:
            live[key] = str(value)
    return ServerFacts(version=parse_version(said.build_info or "")), live


def host_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, bytes; None where it cannot be read."""
    return _meminfo().get("MemAvailable")


_NODE_AVAILABLE = ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable")


def vllm_cpu_memory() -> tuple[int, int] | None:
    """(total, available) bytes as vLLM's CPU worker counts them (vllm/utils/cpu_resource_utils.py): NUMA node 0's
    MemTotal and MemFree + file pages + SReclaimable where the kernel shows nodes (on one VM here node 0 held 15.7
    GiB of /proc/meminfo's 23.5), else /proc/meminfo's MemTotal and MemAvailable; both clamped to a cgroup's memory
    limit below that total. None where nothing can be read."""
    node = Path("/sys/devices/system/node/node0/meminfo")
    parts = _NODE_AVAILABLE if node.exists() else ("MemAvailable",)
    m = _meminfo(node) if node.exists() else _meminfo()
    if "MemTotal" not in m or any(k not in m for k in parts):
        return None
    total, available = m["MemTotal"], sum(m[k] for k in parts)
    limit = _cgroup_int("/sys/fs/cgroup/memory.max") or _cgroup_int("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    if limit is not None and limit < min(total, 1 << 62):
        usage = _cgroup_int("/sys/fs/cgroup/memory.current") or _cgroup_int(
            "/sys/fs/cgroup/memory/memory.usage_in_bytes"
        )
        total, available = limit, max(0, min(available, limit - (usage or 0)))
    return total, available


def _cgroup_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):  # absent, or "max"
        return None


def _meminfo(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    """Every "Key: N kB" line of a meminfo file, in bytes, read once; {} where the file cannot be read.
    /proc/meminfo: "MemTotal: 24684084 kB"; a NUMA node's: "Node 0 MemTotal: 16476364 kB"."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and parts[-1] == "kB" and parts[-3].endswith(":") and parts[-2].isdigit():
            out[parts[-3][:-1]] = int(parts[-2]) * 1024
    return out


def _read(path: str, what: str, limit: int | None = None) -> str:
    """A log's last ``limit`` bytes, or a whole --help text (at most MAX_FILE_BYTES); a stray byte is replaced."""
    try:
        raw = read_tail(path, max_bytes=limit) if limit is not None else read_bytes(path)
    except InputFileError as exc:
        raise ConfigError("tuner recommend", what, str(exc)) from None
    return raw.decode(errors="replace")


def gather_inputs(req: RecommendRequest, cfg: Config, store: Store, now: float) -> list[Inputs]:
    """One Inputs per engine of the target, from the store, the live server and the request."""
    target = cfg.target(req.target)
    # What tuner knows is in force (a managed server's flags, the last apply's), then the request's on top.
    in_force = req.in_force if req.in_force is not None else flags_in_force(store.engine, target)
    given = {**in_force, **req.flags}
    server, live = _live_server(target.backend, target.url)
    if req.help_file:
        server = ServerFacts(server.version, help_flags(_read(req.help_file, "--help-file")))
    live_gguf = live.get("model_path") if live.get("model_path", "").endswith(".gguf") else None
    model_path = req.model or (target.managed.model if target.managed else None) or live_gguf
    model = load_model(model_path) if model_path and Path(model_path).exists() else None
    if req.model and model is None:
        raise ModelFactsError(req.model, "no such file or directory")
    startup = _read(req.startup_log, "--startup-log", limit=20000) if req.startup_log else None
    return engine_inputs(
        cfg,
        store,
        target,
        req.window_s,
        now,
        given=given,
        model=model,
        server=(server, live),
        gpu_vendor=req.gpu_vendor,
        startup=startup,
        repeated_prefix_share=req.repeated_prefix_share,
    )


def engine_inputs(
    cfg: Config,
    store: Store,
    target: Target,
    window_s: float,
    now: float,
    *,
    given: Mapping[str, Any],
    model: ModelFacts | None,
    server: tuple[ServerFacts, dict[str, str]] | None = None,
    gpu_vendor: str | None = None,
    startup: str | None = None,
    repeated_prefix_share: float | None = None,
) -> list[Inputs]:
    """One Inputs per engine of the target from facts the caller has read (``given``: the flags in force and
    any on top; ``model``: the memory model's facts) and the signals of the stored window; ``server``: the live
    server's version and config, asked here when not given. `tuner tune` seeds its search from these."""
    start_ms, end_ms = int(round((now - window_s) * 1000)), int(round(now * 1000))
    pairs: list[tuple[Any, Any]] = []
    if target.name in store.target_names():  # never scraped: only a start-up log can be evaluated
        window = store.window(target.name, now - window_s, now)
        pairs = list(zip(window.engines, compute_signals(window, slo=target.slo).engines))
    facts, live = server if server is not None else _live_server(target.backend, target.url)
    gpu = gpu_facts(
        store.gpu_latest(max_age_s=max(60.0, 3 * cfg.gpu.interval.total_seconds()), now=now), vendor=gpu_vendor
    )
    if not pairs and startup:  # a server that never started has no samples; its log is the evidence
        pairs = [
            (
                EngineWindow(engine="0", model_name="", series={}, hists={}),
                EngineSignals(engine="0", model_name="", samples=0),
            )
        ]
    out = []
    for e_win, e_sig in pairs:
        flags = flags_from_live_config(target.backend, {**e_win.config, **live})
        if live.get("max_model_len"):
            flags["max_model_len"] = int(live["max_model_len"])
        flags.update(given)
        out.append(
            Inputs(
                target=target.name,
                backend=target.backend,
                now=now,
                window_s=window_s,
                signals=e_sig,
                observed=observe(e_win, target.backend, start_ms, end_ms),
                flags=flags,
                model=model,
                gpu=gpu,
                server=facts,
                live=dict(e_win.config),
                slo=target.slo,
                startup_error=startup,
                repeated_prefix_share=repeated_prefix_share,
                host_memory_available_bytes=host_available_bytes(),
                started_with={**target.managed.extra_args, **given} if target.managed is not None else None,
            )
        )
    return out


def persist(engine: Any, target: str, outcome: Outcome, now: float) -> list[int]:
    """Write an outcome: new proposals added, seen ones renewed, recovered ones expired. Returns emitted ids."""
    ids = []
    for r in outcome.emitted:
        evidence = [dict(e) for e in r.evidence]
        if r.key in outcome.refreshed:
            rid = outcome.refreshed[r.key]
            # a measurement `tuner tune` added stays with it: the rules renew their own evidence only
            measured = [e for e in recs.get_recommendation(engine, rid).evidence if e.get("rule") == "tune"]
            recs.renew_recommendation(
                engine,
                rid,
                now=now,
                rules=[*r.rules, *(["tune"] if measured else [])],
                evidence=evidence + measured,
                confidence=r.confidence,
                memory_check=r.memory.as_json(),
                current=dict(r.current),
            )
        else:
            rid = recs.add_recommendation(
                engine,
                target=target,
                now=now,
                rules=r.rules,
                diff_key=r.key,
                diff=dict(r.diff),
                current=dict(r.current),
                evidence=evidence,
                expected_effect=r.expected_effect,
                risk=r.risk,
                confidence=r.confidence,
                rank=r.rank,
                memory_check=r.memory.as_json(),
            )
        ids.append(rid)
    for rid in outcome.expired:
        recs.set_status(engine, rid, "expired", now=now, note="the symptom is gone (signals recovered)")
    return ids


def recommend(cfg: Config, store: Store, req: RecommendRequest, now: float) -> dict[str, Any]:
    """Evaluate one target and persist the outcome; the result as `tuner recommend --json` prints it."""
    inputs = gather_inputs(req, cfg, store, now)
    previous = [Previous(r.id, r.diff_key) for r in recs.proposed_for(store.engine, req.target)]
    result: dict[str, Any] = {
        "target": req.target,
        "at": now,
        "window_s": req.window_s,
        "recommendations": [],
        "suppressed": [],
        "expired": [],
        "evaluated": bool(inputs),
    }
    outcomes = [(inp, evaluate(inp, previous)) for inp in inputs]
    # A stored proposal expires only when every engine that has data no longer proposes it: one engine's
    # recovery must not expire what another engine's symptom still calls for.
    with_data = [set(o.expired) for inp, o in outcomes if inp.signals.samples > 0]
    expired = set.intersection(*with_data) if with_data else set()
    for i, (_inp, outcome) in enumerate(outcomes):
        outcome = dataclasses.replace(outcome, expired=tuple(sorted(expired)) if i == 0 else ())
        ids = persist(store.engine, req.target, outcome, now)
        result["recommendations"] += [recs.get_recommendation(store.engine, rid).as_json() for rid in ids]
        result["suppressed"] += [s.__dict__ for s in outcome.suppressed]
        result["expired"] += list(outcome.expired)
    return result


def stored(store: Store, *, target: str | None = None, status: str | None = None) -> list[recs.StoredRecommendation]:
    """Stored recommendations, newest first; ConfigError naming --status when it is not a status."""
    if status is not None and status not in recs.STATUSES:
        raise ConfigError(
            "tuner recommendations list", "--status", f"{status!r}: expected one of {', '.join(recs.STATUSES)}"
        )
    return recs.list_recommendations(store.engine, target=target, status=status)


def one(store: Store, rec_id: int) -> recs.StoredRecommendation:
    return recs.get_recommendation(store.engine, rec_id)
