"""``tuner plan``, ``tuner recommend``, ``tuner recommendations list|show`` (use case: tuner/app/recommend.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from tuner.advise.facts import load_model
from tuner.advise.memory import GIB, plan
from tuner.app.recommend import RecommendRequest, one, recommend, stored
from tuner.cli.common import RECORD_ID, duration, float_in, int_in, session, when
from tuner.config import parse_duration
from tuner.errors import ConfigError
from tuner.flags import spec, validate

__all__ = ["add_parsers"]


# ---- plan ----------------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> int:
    model = load_model(args.model)
    try:
        p = plan(
            model,
            gpu_memory_bytes=int(args.gpu_memory_gib * GIB),
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=args.max_model_len,
            kv_cache_dtype=args.kv_cache_dtype,
            tensor_parallel_size=args.tensor_parallel_size,
            quantization=args.quantization,
            block_size=args.block_size,
            kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        )
    except ValueError as exc:
        raise ConfigError("tuner plan", "arguments", str(exc)) from None
    if args.json:
        print(json.dumps({**p.as_json(), "model": model.as_json()}))
        return 0
    print(f"{model.architecture} ({model.params / 1e9:.2f} B parameters) from {model.source}")
    rows = [
        ("weights", f"{p.weights_bytes / 1e9:.2f} GB total, {p.weights_bytes_per_gpu / GIB:.2f} GiB per GPU"),
        ("KV per token", f"{p.kv_bytes_per_token} bytes ({p.kv_bytes_per_token_per_gpu} per GPU, {p.kv_cache_dtype})"),
        ("overhead", f"{p.overhead_bytes / GIB:.2f} GiB per GPU (CUDA context, graphs, activations)"),
        (
            "KV budget",
            f"{p.kv_budget_bytes / GIB:.2f} GiB per GPU at {p.gpu_memory_utilization:g} of "
            f"{p.gpu_memory_bytes / GIB:.2f} GiB",
        ),
        ("KV capacity", f"{p.kv_capacity_tokens} tokens in {p.kv_blocks} blocks of {p.block_size}"),
        ("max concurrency", f"{p.max_concurrency:.2f} sequences of {p.max_model_len} tokens"),
        ("fits", f"{'yes' if p.fits else 'NO'}: {p.reason}"),
    ]
    for k, v in rows:
        print(f"  {k:16} {v}")
    return 0 if p.fits else 1


def _parse_flag(backend: str, text: str) -> tuple[str, Any]:
    """``--flag NAME=VALUE`` as tuner's name and the value as its declared type (ConfigError / FlagError)."""
    name, sep, value = text.partition("=")
    if not sep:
        raise ConfigError("tuner recommend", "--flag", f"expected NAME=VALUE (e.g. max_num_seqs=8), got {text!r}")
    s = spec(backend, name.strip())
    return s.name, validate(backend, s.name, value.strip())


def cmd_recommend(args: argparse.Namespace) -> int:
    s = session(args)
    backend = s.cfg.target(args.target).backend  # an unknown target is named before a --flag is read
    flags = dict(_parse_flag(backend, f) for f in args.flag or ())
    req = RecommendRequest(
        args.target,
        args.window.total_seconds(),
        flags=flags,
        model=args.model,
        gpu_vendor=args.gpu_vendor,
        startup_log=args.startup_log,
        help_file=args.help_file,
        repeated_prefix_share=args.repeated_prefix_share,
    )
    result = recommend(s.cfg, s.store, req, time.time())
    if not result.pop("evaluated"):
        print(
            f"tuner: warning: {args.target} has no samples in the last {args.window.total_seconds():g}s; "
            "nothing to evaluate (is `tuner run` running?)",
            file=sys.stderr,
        )
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


def _diff_text(r: dict[str, Any]) -> str:
    """``flag: old -> new``; "?" where the old value is not known, "default" where the server runs without the flag
    (as far as tuner knows: the rule recorded it as None)."""
    current = r["current"]
    return ", ".join(
        f"{k}: {'?' if k not in current else 'default' if current[k] is None else current[k]} -> {v}"
        for k, v in r["diff"].items()
    )


def _print_one(r: dict[str, Any], brief: bool = False) -> None:
    print(
        f"#{r['id']} {r['target']} [{r['status']}] {_diff_text(r)}  (rank {r['rank']}, confidence "
        f"{r['confidence']:.2f})"
    )
    print(f"    why: {', '.join(r['rules'])}; effect: {r['expected_effect']}")
    print(
        f"    risk: {r['risk']}; memory: {'ok' if r['memory_check'].get('ok') else 'REJECTED'} — "
        f"{r['memory_check'].get('reason', '')}"
    )
    if brief:
        return
    print(
        f"    created {when(r['created_ms'])}, updated {when(r['updated_ms'])}"
        + (f"; note: {r['note']}" if r["note"] else "")
    )
    for ev in r["evidence"]:
        print(f"    evidence ({ev.get('rule')}, window {ev.get('window_s')}s):")
        for t in ev.get("thresholds", []):
            print(f"      {t['signal']} = {t['value']} {t['op']} {t['threshold']}")
        for k, v in (ev.get("signals") or {}).items():
            print(f"      {k}: {v}")


def cmd_recommendations(args: argparse.Namespace) -> int:
    store = session(args).store
    if args.rec_command == "show":
        r = one(store, args.id).as_json()
        print(json.dumps(r)) if args.json else _print_one(r)
        return 0
    rows = [r.as_json() for r in stored(store, target=args.target, status=args.status)]
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print("no recommendations")
    for r in rows:
        print(
            f"#{r['id']:<4} {when(r['updated_ms'])}  {r['target']:16} {r['status']:11} {_diff_text(r)}  "
            f"[{', '.join(r['rules'])}]"
        )
    return 0


def add_parsers(sub: Any) -> None:
    """Register plan / recommend / recommendations on the top-level subparsers."""
    p = sub.add_parser("plan", help="memory plan: weights, KV bytes per token, KV capacity, concurrency, fits")
    p.add_argument("--model", required=True, help="model dir (config.json [+ safetensors]), a config.json or a .gguf")
    p.add_argument(
        "--gpu-memory-gib", type=float_in(0, 2**20, low_open=True), required=True, help="memory of one GPU, GiB"
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=float_in(0, 1, low_open=True),
        default=0.9,
        help="vLLM's fraction (default 0.9)",
    )
    p.add_argument("--max-model-len", type=int_in(1, 2**31 - 1), help="default: the model's max_position_embeddings")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto | fp8 | fp8_e4m3 | fp8_e5m2")
    p.add_argument("--tensor-parallel-size", type=int_in(1, 4096), default=1)
    p.add_argument("--quantization", help="awq | gptq | fp8 (default: the checkpoint's own)")
    p.add_argument("--block-size", type=int_in(1, 2**20), default=16, help="KV block, tokens (vLLM GPU 16, CPU 128)")
    p.add_argument(
        "--kv-cache-memory-bytes", type=int_in(1, 2**60), help="vLLM's fixed KV size (skips the utilization arithmetic)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    r = sub.add_parser("recommend", help="evaluate one target now: flag recommendations with evidence, stored")
    r.add_argument("target")
    r.add_argument("--window", type=duration, default=parse_duration("5m"), help="signal window (default 5m)")
    r.add_argument(
        "--flag",
        action="append",
        metavar="NAME=VALUE",
        help="a current flag the server does not report (e.g. max_num_seqs=8); repeatable",
    )
    r.add_argument("--model", help="model dir / config.json / .gguf for the memory model")
    r.add_argument("--gpu-vendor", choices=["nvidia", "amd", "none"], help="override the GPU vendor NVML implies")
    r.add_argument("--startup-log", help="log of a start that failed (start-up OOM remedies)")
    r.add_argument("--help-file", help="the server's --help output: decides which flags it supports")
    r.add_argument(
        "--repeated-prefix-share",
        type=float_in(0, 1),
        help="fraction 0-1 of prompt tokens in repeated prefixes (vLLM cannot count them with caching off)",
    )
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
    sh.add_argument("id", type=RECORD_ID)
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=cmd_recommendations)
