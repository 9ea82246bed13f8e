"""``tuner plan``, ``tuner recommend``, ``tuner recommendations list|show``: the I/O around the pure advisor.

Here, and only here, the advisor's inputs are gathered: the stored window, the GPU reading, the server's
version and live config over HTTP, model files, /proc/meminfo. Then ``evaluate`` decides and this persists.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import requests

from tuner.advise.diagnose import Inputs
from tuner.advise.facts import ServerFacts, flags_from_live_config, gpu_facts, load_model, observe
from tuner.advise.memory import GIB, plan
from tuner.advise.recommend import Outcome, Previous, evaluate
from tuner.errors import ConfigError, ModelFactsError
from tuner.flags import help_flags, parse_version, validate
from tuner.signals.derive import compute_signals
from tuner.store import recommendations as recs

__all__ = ["cmd_plan", "cmd_recommend", "cmd_recommendations", "add_parsers", "persist", "gather_inputs",
           "recommend_target"]

_HTTP_TIMEOUT_S = 3.0


# ---- plan ----------------------------------------------------------------------------------------

def cmd_plan(args: argparse.Namespace) -> int:
    model = load_model(args.model)
    try:
        p = plan(model, gpu_memory_bytes=int(args.gpu_memory_gib * GIB),
                 gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.max_model_len,
                 kv_cache_dtype=args.kv_cache_dtype, tensor_parallel_size=args.tensor_parallel_size,
                 quantization=args.quantization, block_size=args.block_size,
                 kv_cache_memory_bytes=args.kv_cache_memory_bytes)
    except ValueError as exc:
        raise ConfigError("tuner plan", "arguments", str(exc)) from None
    if args.json:
        print(json.dumps({**p.as_json(), "model": model.as_json()}))
        return 0
    print(f"{model.architecture} ({model.params / 1e9:.2f} B parameters) from {model.source}")
    rows = [("weights", f"{p.weights_bytes / 1e9:.2f} GB total, {p.weights_bytes_per_gpu / GIB:.2f} GiB per GPU"),
            ("KV per token", f"{p.kv_bytes_per_token} bytes ({p.kv_bytes_per_token_per_gpu} per GPU, "
                             f"{p.kv_cache_dtype})"),
            ("overhead", f"{p.overhead_bytes / GIB:.2f} GiB per GPU (CUDA context, graphs, activations)"),
            ("KV budget", f"{p.kv_budget_bytes / GIB:.2f} GiB per GPU at {p.gpu_memory_utilization:g} of "
                          f"{p.gpu_memory_bytes / GIB:.2f} GiB"),
            ("KV capacity", f"{p.kv_capacity_tokens} tokens in {p.kv_blocks} blocks of {p.block_size}"),
            ("max concurrency", f"{p.max_concurrency:.2f} sequences of {p.max_model_len} tokens"),
            ("fits", f"{'yes' if p.fits else 'NO'}: {p.reason}")]
    for k, v in rows:
        print(f"  {k:16} {v}")
    return 0 if p.fits else 1


# ---- gathering live facts ------------------------------------------------------------------------

def _get_json(url: str) -> Any | None:
    try:
        resp = requests.get(url, timeout=_HTTP_TIMEOUT_S, proxies={"http": "", "https": ""})
        return resp.json() if resp.status_code == 200 else None
    except (requests.RequestException, ValueError):
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
    props = _get_json(f"{url}/props") or {}
    settings = props.get("default_generation_settings") or {}
    for key, value in (("total_slots", props.get("total_slots")), ("n_ctx", settings.get("n_ctx")),
                       ("model_path", props.get("model_path"))):
        if value is not None:
            live[key] = str(value)
    return ServerFacts(version=parse_version(str(props.get("build_info") or ""))), live


def _host_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _parse_flag(backend: str, text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep:
        raise ConfigError("tuner recommend", "--flag", f"expected NAME=VALUE (e.g. max_num_seqs=8), got {text!r}")
    from tuner.flags import spec

    s = spec(backend, name.strip())
    return s.name, validate(backend, s.name, value.strip())


def gather_inputs(args: argparse.Namespace, cfg: Any, store: Any, now: float) -> list[Inputs]:
    """One Inputs per engine of the target, from the store, the live server and the command line."""
    target = cfg.target(args.target)
    window_s = args.window.total_seconds()
    from tuner.apply.flow import flags_in_force

    # What tuner knows is in force (a managed server's flags, the last apply's), then --flag on top.
    given = {**flags_in_force(store.engine, target),
             **dict(_parse_flag(target.backend, f) for f in args.flag or ())}
    start_ms, end_ms = int(round((now - window_s) * 1000)), int(round(now * 1000))
    pairs: list[tuple[Any, Any]] = []
    if target.name in store.target_names():  # never scraped: only a start-up log can be evaluated
        window = store.window(target.name, now - window_s, now)
        pairs = list(zip(window.engines, compute_signals(window, slo=target.slo).engines))
    server, live = _live_server(target.backend, target.url)
    if args.help_file:
        try:
            server = ServerFacts(server.version, help_flags(Path(args.help_file).read_text(errors="replace")))
        except OSError as exc:
            raise ConfigError("tuner recommend", "--help-file", f"cannot read {args.help_file}: {exc}") from None
    model_path = args.model or (target.managed.model if target.managed else None) or (live.get("model_path") if live.get("model_path", "").endswith(".gguf") else None)
    model = load_model(model_path) if model_path and Path(model_path).exists() else None
    if args.model and model is None:
        raise ModelFactsError(args.model, "no such file or directory")
    gpu = gpu_facts(store.gpu_latest(max_age_s=max(60.0, 3 * cfg.gpu.interval.total_seconds()), now=now),
                    vendor=args.gpu_vendor)
    startup = None
    if args.startup_log:
        try:
            startup = Path(args.startup_log).read_text(errors="replace")[-20000:]
        except OSError as exc:
            raise ConfigError("tuner recommend", "--startup-log", f"cannot read {args.startup_log}: {exc}") from None
    if not pairs and startup:  # a server that never started has no samples; its log is the evidence
        from tuner.signals.derive import EngineSignals
        from tuner.store.window import EngineWindow

        pairs = [(EngineWindow(engine="0", model_name="", series={}, hists={}),
                  EngineSignals(engine="0", model_name="", samples=0))]
    out = []
    for e_win, e_sig in pairs:
        flags = flags_from_live_config(target.backend, {**e_win.config, **live})
        if live.get("max_model_len"):
            flags["max_model_len"] = int(live["max_model_len"])
        flags.update(given)
        out.append(Inputs(target=target.name, backend=target.backend, now=now, window_s=window_s, signals=e_sig,
                          observed=observe(e_win, target.backend, start_ms, end_ms), flags=flags,
                          model=model, gpu=gpu, server=server, live=dict(e_win.config), slo=target.slo,
                          startup_error=startup, repeated_prefix_share=args.repeated_prefix_share,
                          host_memory_available_bytes=_host_available_bytes()))
    return out


def persist(engine: Any, target: str, outcome: Outcome, now: float) -> list[int]:
    """Write an outcome: new proposals added, seen ones renewed, recovered ones expired. Returns emitted ids."""
    ids = []
    for r in outcome.emitted:
        evidence = [dict(e) for e in r.evidence]
        if r.key in outcome.refreshed:
            rid = outcome.refreshed[r.key]
            recs.renew_recommendation(engine, rid, now=now, rules=r.rules, evidence=evidence,
                                      confidence=r.confidence, memory_check=r.memory.as_json())
        else:
            rid = recs.add_recommendation(engine, target=target, now=now, rules=r.rules, diff_key=r.key,
                                          diff=dict(r.diff), current=dict(r.current), evidence=evidence,
                                          expected_effect=r.expected_effect, risk=r.risk, confidence=r.confidence,
                                          rank=r.rank, memory_check=r.memory.as_json())
        ids.append(rid)
    for rid in outcome.expired:
        recs.set_status(engine, rid, "expired", now=now, note="the symptom is gone (signals recovered)")
    return ids


# ---- recommend / recommendations -----------------------------------------------------------------

def _recommend(args: argparse.Namespace, cfg: Any, store: Any, now: float) -> dict[str, Any]:
    """Evaluate one target and persist the outcome; the result as `tuner recommend --json` prints it."""
    inputs = gather_inputs(args, cfg, store, now)
    previous = [Previous(r.id, r.diff_key) for r in recs.proposed_for(store.engine, args.target)]
    result: dict[str, Any] = {"target": args.target, "at": now, "window_s": args.window.total_seconds(),
                              "recommendations": [], "suppressed": [], "expired": [], "evaluated": bool(inputs)}
    outcomes = [(inp, evaluate(inp, previous)) for inp in inputs]
    # A stored proposal expires only when every engine that has data no longer proposes it: one engine's
    # recovery must not expire what another engine's symptom still calls for.
    with_data = [set(o.expired) for inp, o in outcomes if inp.signals.samples > 0]
    expired = set.intersection(*with_data) if with_data else set()
    for i, (inp, outcome) in enumerate(outcomes):
        outcome = dataclasses.replace(outcome, expired=tuple(sorted(expired)) if i == 0 else ())
        ids = persist(store.engine, args.target, outcome, now)
        result["recommendations"] += [recs.get_recommendation(store.engine, i).as_json() for i in ids]
        result["suppressed"] += [s.__dict__ for s in outcome.suppressed]
        result["expired"] += list(outcome.expired)
    return result


def recommend_target(cfg: Any, store: Any, target: str, *, now: float, window: Any, flags: dict[str, Any],
                     model: str | None = None) -> dict[str, Any]:
    """`tuner recommend TARGET` for auto mode: the flags tuner knows are in force, the managed model's facts."""
    args = argparse.Namespace(target=target, window=window, flag=[f"{k}={v}" for k, v in flags.items()],
                              model=model if model and Path(model).exists() else None, gpu_vendor=None,
                              startup_log=None, help_file=None, repeated_prefix_share=None)
    return _recommend(args, cfg, store, now)


def cmd_recommend(args: argparse.Namespace) -> int:
    from tuner.cli import _load, _open_store

    cfg = _load(args)
    store = _open_store(cfg)
    now = time.time()
    result = _recommend(args, cfg, store, now)
    if not result.pop("evaluated"):
        print(f"tuner: warning: {args.target} has no samples in the last {args.window.total_seconds():g}s; "
              "nothing to evaluate (is `tuner run` running?)", file=sys.stderr)
    if args.json:
        print(json.dumps(result, default=str))
        return 0
    if not result["recommendations"]:
        print(f"{args.target}: no recommendation (window {args.window.total_seconds():g}s)")
    for r in result["recommendations"]:
        _print_one(r, brief=True)
    for s in result["suppressed"]:
        print(f"  suppressed {s['rule']} {json.dumps(s['diff'])}: {s['reason']}")
    for rid in result["expired"]:
        print(f"  expired #{rid}: the symptom is gone")
    return 0


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _diff_text(r: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {r['current'].get(k, '?')} -> {v}" for k, v in r["diff"].items())


def _print_one(r: dict[str, Any], brief: bool = False) -> None:
    print(f"#{r['id']} {r['target']} [{r['status']}] {_diff_text(r)}  (rank {r['rank']}, confidence "
          f"{r['confidence']:.2f})")
    print(f"    why: {', '.join(r['rules'])}; effect: {r['expected_effect']}")
    print(f"    risk: {r['risk']}; memory: {'ok' if r['memory_check'].get('ok') else 'REJECTED'} — "
          f"{r['memory_check'].get('reason', '')}")
    if brief:
        return
    print(f"    created {_when(r['created_ms'])}, updated {_when(r['updated_ms'])}" +
          (f"; note: {r['note']}" if r["note"] else ""))
    for ev in r["evidence"]:
        print(f"    evidence ({ev.get('rule')}, window {ev.get('window_s')}s):")
        for t in ev.get("thresholds", []):
            print(f"      {t['signal']} = {t['value']} {t['op']} {t['threshold']}")
        for k, v in (ev.get("signals") or {}).items():
            print(f"      {k}: {v}")


def cmd_recommendations(args: argparse.Namespace) -> int:
    from tuner.cli import _load, _open_store

    store = _open_store(_load(args))
    if args.rec_command == "show":
        r = recs.get_recommendation(store.engine, args.id).as_json()
        print(json.dumps(r)) if args.json else _print_one(r)
        return 0
    if args.status is not None and args.status not in recs.STATUSES:
        raise ConfigError("tuner recommendations list", "--status",
                          f"{args.status!r}: expected one of {', '.join(recs.STATUSES)}")
    rows = [r.as_json() for r in recs.list_recommendations(store.engine, target=args.target, status=args.status)]
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print("no recommendations")
    for r in rows:
        print(f"#{r['id']:<4} {_when(r['updated_ms'])}  {r['target']:16} {r['status']:11} {_diff_text(r)}  "
              f"[{', '.join(r['rules'])}]")
    return 0


def add_parsers(sub: Any, duration: Any, default_window: Any) -> None:
    """Register plan / recommend / recommendations on the top-level subparsers."""
    p = sub.add_parser("plan", help="memory plan: weights, KV bytes per token, KV capacity, concurrency, fits")
    p.add_argument("--model", required=True, help="model dir (config.json [+ safetensors]), a config.json or a .gguf")
    p.add_argument("--gpu-memory-gib", type=float, required=True, help="memory of one GPU, GiB")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vLLM's fraction (default 0.9)")
    p.add_argument("--max-model-len", type=int, help="default: the model's max_position_embeddings")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto | fp8 | fp8_e4m3 | fp8_e5m2")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--quantization", help="awq | gptq | fp8 (default: the checkpoint's own)")
    p.add_argument("--block-size", type=int, default=16, help="KV block, tokens (vLLM GPU 16, CPU 128)")
    p.add_argument("--kv-cache-memory-bytes", type=int, help="vLLM's fixed KV size (skips the utilization arithmetic)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    r = sub.add_parser("recommend", help="evaluate one target now: flag recommendations with evidence, stored")
    r.add_argument("target")
    r.add_argument("--window", type=duration, default=default_window, help="signal window (default 5m)")
    r.add_argument("--flag", action="append", metavar="NAME=VALUE",
                   help="a current flag the server does not report (e.g. max_num_seqs=8); repeatable")
    r.add_argument("--model", help="model dir / config.json / .gguf for the memory model")
    r.add_argument("--gpu-vendor", choices=["nvidia", "amd", "none"], help="override the GPU vendor NVML implies")
    r.add_argument("--startup-log", help="log of a start that failed (start-up OOM remedies)")
    r.add_argument("--help-file", help="the server's --help output: decides which flags it supports")
    r.add_argument("--repeated-prefix-share", type=float,
                   help="fraction 0-1 of prompt tokens in repeated prefixes (vLLM cannot count them with caching off)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_recommend)

    s = sub.add_parser("recommendations", help="stored recommendations: list, or show one")
    ssub = s.add_subparsers(dest="rec_command", required=True, metavar="list|show")
    ls = ssub.add_parser("list", help="newest first")
    ls.add_argument("--target")
    ls.add_argument("--status", help="proposed | applied | rejected | expired | rolled_back | failed")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_recommendations)
    sh = ssub.add_parser("show", help="one recommendation with its evidence")
    sh.add_argument("id", type=int)
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=cmd_recommendations)

