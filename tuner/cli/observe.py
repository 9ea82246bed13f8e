"""``tuner run``, ``db``, ``status``, ``signals``, ``snapshot``, ``demo``: watching servers."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from tuner.app import status as status_app
from tuner.cli.common import duration, float_in, fmt, int_in, session, table, unix_time
from tuner.collect import llamacpp
from tuner.collect.exposition import decode_body
from tuner.collect.scrape import scrape_url, snapshot_from_text
from tuner.collect.snapshots import TargetSnapshot
from tuner.config import parse_duration
from tuner.errors import ConfigError, InputFileError, ScrapeError
from tuner.files import MAX_FILE_BYTES, read_bytes
from tuner.store.db import current_revision, head_revision, open_engine, redact_url, upgrade

__all__ = ["add_parsers"]


def cmd_run(args: argparse.Namespace) -> int:
    from tuner.daemon import serve_daemon  # the daemon face: imported only by the command that starts it

    return serve_daemon(
        session(args, pods=False),
        max_seconds=args.duration.total_seconds() if args.duration else None,
        log=logging.getLogger("tuner"),
    )


def cmd_db(args: argparse.Namespace) -> int:
    cfg = session(args, pods=False).cfg  # its store is not opened through the session: no schema check here
    engine = open_engine(cfg.store.url)
    if args.db_command == "upgrade":
        before, after = upgrade(engine)
        print(
            f"{redact_url(cfg.store.url)}: {before or 'empty'} -> {after}"
            if before != after
            else f"{redact_url(cfg.store.url)}: already at {after}"
        )
    else:
        current, head = current_revision(engine), head_revision()
        print(f"{redact_url(cfg.store.url)}: {current or 'no schema'} (this tuner: {head})")
        return 0 if current == head else 1
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    s = session(args)
    now = time.time()
    st = status_app.status(s, window_s=args.window.total_seconds(), now=now)
    if args.json:
        print(
            json.dumps(
                {
                    "targets": [r.as_json() for r in st.targets if r.signals is not None],
                    "groups": [g.as_json() for g in st.groups],
                    "gpus": [g.__dict__ for g in st.gpus],
                },
                default=list,
            )
        )
        return 0
    # Peaks over the window for the gauges a loaded server's scrapes miss; the queue from its histogram.
    rows = [
        [
            "TARGET",
            "BACKEND",
            "HEALTH",
            "ENGINE/MODEL",
            "KV% PEAK",
            "RUN/WAIT PEAK",
            "QUEUED P99",
            "TTFT P99",
            "E2E P99",
            "IN SLO",
            "GOOD TOK/S",
            "LAST APPLY",
            "LAST SCRAPE",
            "LAST ERROR",
        ]
    ]
    for r in st.targets:
        t, sig = r.target, r.signals
        last = _last_apply(r.last_apply)
        if sig is None:
            rows.append(
                [t.name, t.backend, "never", "-", "-", "-", "-", "-", "-", "-", "-", last, "-", "not scraped yet"]
            )
            continue
        h = sig.health
        age = f"{now - h.last_scrape_ms / 1000:.0f}s ago" if h else "-"
        err = (h.last_error[:60] + ("…" if len(h.last_error) > 60 else "")) if h and h.last_error else ""
        if not sig.engines:
            rows.append(
                [t.name, t.backend, h.health if h else "-", "-", "-", "-", "-", "-", "-", "-", "-", last, age, err]
            )
        for e in sig.engines:
            rows.append(
                [
                    t.name,
                    t.backend,
                    h.health if h else "-",
                    f"{e.engine}/{e.model_name}",
                    fmt(e.kv_cache_usage_max, 100, "%", 1),
                    f"{fmt(e.requests_running_max, digits=0)}/{fmt(e.requests_waiting_max, digits=0)}",
                    fmt(e.queue_p99, 1, "s", 2),
                    fmt(e.ttft_p99, 1000, "ms", 0),
                    fmt(e.e2e_p99, 1, "s", 2),
                    fmt(e.goodput_ratio, 100, "%", 0),
                    fmt(e.token_goodput_per_s, 1, "", 1),
                    last,
                    age,
                    err,
                ]
            )
    for grp in st.groups:  # what the replicas served together: rates and running/waiting add up, KV is the fullest's
        for e in grp.signals.engines if grp.signals else ():
            rows.append(
                [
                    f"{grp.name} (group)",
                    grp.replicas[0].target.backend,
                    f"{grp.up}/{len(grp.replicas)} up",
                    f"{e.engine}/{e.model_name}",
                    fmt(e.kv_cache_usage_max, 100, "%", 1),
                    f"{fmt(e.requests_running_max, digits=0)}/{fmt(e.requests_waiting_max, digits=0)}",
                    fmt(e.queue_p99, 1, "s", 2),
                    fmt(e.ttft_p99, 1000, "ms", 0),
                    fmt(e.e2e_p99, 1, "s", 2),
                    fmt(e.goodput_ratio, 100, "%", 0),
                    fmt(e.token_goodput_per_s, 1, "", 1),
                    "-",
                    "-",
                    "",
                ]
            )
    print(f"tuner status — window {st.window_s:g}s (peaks and P99s over it), store {redact_url(s.cfg.store.url)}")
    print(table(rows))
    if st.gpu_note:
        print(f"\nGPU ({s.cfg.gpu.source}): {st.gpu_note}" if s.cfg.gpu.source != "none" else f"\nGPU: {st.gpu_note}")
        return 0
    grows = [["GPU", "NAME", "MEM USED", "MEM TOTAL", "UTIL", "TEMP", "POWER", "PROCESSES"]]
    for g in st.gpus:
        grows.append(
            [
                str(g.index),
                g.name,
                fmt(g.memory_used_bytes, 2**-30, " GiB", 1),
                fmt(g.memory_total_bytes, 2**-30, " GiB", 1),
                fmt(g.utilization, 100, "%", 0),
                fmt(g.temperature_c, 1, "C", 0),
                fmt(g.power_w, 1, "W", 0),
                ", ".join(f"{pid}:{name or '?'}" for pid, name, _ in g.processes) or "-",
            ]
        )
    print()
    print(table(grows))
    return 0


def _last_apply(a: Any) -> str:
    if a is None:
        return "-"
    what = a.outcome or a.state  # in progress: its step
    return f"#{a.id} {','.join(f'{k}={v}' for k, v in a.diff.items())} {what}"


def cmd_signals(args: argparse.Namespace) -> int:
    at = args.at if args.at is not None else time.time()
    sig = status_app.signals(session(args), args.target, window_s=args.window.total_seconds(), at=at)
    if args.json:
        print(json.dumps(sig.as_json()))
        return 0
    for e in sig.engines:
        print(f"{sig.target} engine {e.engine} model {e.model_name} (window {sig.window_s:g}s)")
        for k, v in e.as_json().items():
            if k not in ("engine", "model_name"):
                print(f"  {k:26} {v if v is not None else '-'}")
    if not sig.engines:
        print(f"{sig.target}: no samples in the last {sig.window_s:g}s")
    return 0


def _read(path: str, max_bytes: int) -> bytes:
    """A saved body, read up to ``max_bytes`` as a scrape's is (``--file /dev/zero`` stops there)."""
    try:
        return read_bytes(path, max_bytes=max_bytes, cap="--max-bytes")
    except InputFileError as exc:
        raise ScrapeError(str(exc)) from None


def cmd_snapshot(args: argparse.Namespace) -> int:
    """Needs no config: a URL or a saved exposition."""
    now = time.time()
    snap: TargetSnapshot
    if args.file:
        text = decode_body(_read(args.file, args.max_bytes))
        slots = llamacpp.parse_slots(_read(args.slots_file, args.max_bytes)) if args.slots_file else None
        snap = snapshot_from_text(
            args.backend, text, target=args.file, ts=now, slots=slots, model_name=args.model_name or "llama-server"
        )
    else:
        url = args.url.rstrip("/").removesuffix("/metrics")
        snap = scrape_url(
            args.backend,
            url,
            target=url,
            timeout_s=args.timeout,
            max_bytes=args.max_bytes,
            model_name=args.model_name or "llama-server",
            now=now,
        )
    for problem in snap.problems:
        print(f"tuner: warning: {problem}", file=sys.stderr)
    for e in snap.engines:
        obj: dict[str, Any] = e.as_json()
        if args.json:
            print(json.dumps(obj))
        else:
            print(f"{obj.pop('model_name')} (engine {obj.pop('engine')}, {obj.pop('backend')})")
            for k, v in obj.items():
                print(f"  {k:32} {v if k != 'config' else json.dumps(v)}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from tuner.lab.demo import run_demo  # the lab: a demo and its load generator, not part of tuner's flow

    if not args.vllm_python or not args.model:
        raise ConfigError(
            "tuner demo",
            "--vllm-python/--model",
            "both are needed; scripts/demo.sh installs vLLM and makes a tiny model, then runs this",
        )
    return run_demo(vllm_python=args.vllm_python, model=args.model, workdir=Path(args.workdir).resolve())


def add_parsers(sub: Any) -> None:
    r = sub.add_parser("run", help="run the daemon: scrape targets and GPUs into the store, serve tuner's /metrics")
    r.add_argument(
        "--for", dest="duration", type=duration, help="stop after this long (e.g. 2m); default: until SIGTERM/SIGINT"
    )
    r.set_defaults(func=cmd_run)

    d = sub.add_parser("db", help="database schema: upgrade, or show the current revision")
    d.add_argument("db_command", choices=["upgrade", "current"])
    d.set_defaults(func=cmd_db)

    s = sub.add_parser(
        "status",
        help="a table per target (and per replica group: its replicas together): health, "
        "peak KV use and running/waiting, P99 queue time, "
        "TTFT and E2E, share within the SLO, last apply; GPUs",
    )
    s.add_argument("--window", type=duration, default=parse_duration("5m"), help="signal window (default 5m)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.set_defaults(func=cmd_status)

    g = sub.add_parser(
        "signals",
        help="derived signals of one target, or of a replica group (what its replicas served together), over a window",
    )
    g.add_argument("target", help="a target, or a replica group's name")
    g.add_argument(
        "--window",
        type=duration,
        default=parse_duration("5m"),
        help="window (default 5m; one longer than store.retention.raw is read at the rollup step, "
        "as retention will keep it)",
    )
    g.add_argument("--at", type=unix_time, help="evaluate at this unix time instead of now")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_signals)

    n = sub.add_parser(
        "snapshot",
        help="scrape a server (or read a saved exposition) once and print what tuner "
        "sees, one object per engine/model (no config needed)",
    )
    src = n.add_mutually_exclusive_group(required=True)
    src.add_argument("url", nargs="?", help="server base URL, e.g. http://127.0.0.1:8000")
    src.add_argument("--file", help="a saved /metrics exposition")
    n.add_argument("--backend", choices=["vllm", "llamacpp"], required=True)
    n.add_argument("--slots-file", help="llama-server: a saved /slots JSON (derives slots and KV use)")
    n.add_argument("--model-name", help="llama-server: the model name to report (it serves no such label)")
    n.add_argument("--json", action="store_true", help="one JSON object per line")
    n.add_argument("--timeout", type=float_in(0, 3600, low_open=True), default=5.0, help="seconds (default 5)")
    n.add_argument(
        "--max-bytes",
        type=int_in(1, 2**40),
        default=MAX_FILE_BYTES,
        help="largest body (or --file) accepted (default 10 MiB, as defaults.max_body_bytes)",
    )
    n.set_defaults(func=cmd_snapshot)

    m = sub.add_parser(
        "demo",
        help="start a real vLLM on a tiny model, run tuner against it under load, "
        "show what it sees (scripts/demo.sh sets it up)",
    )
    m.add_argument(
        "--vllm-python",
        default=os.environ.get("TUNER_VLLM_PYTHON"),
        help="python of the venv that has vLLM (default $TUNER_VLLM_PYTHON)",
    )
    m.add_argument(
        "--model", default=os.environ.get("TUNER_TINY_MODEL"), help="model directory (default $TUNER_TINY_MODEL)"
    )
    m.add_argument("--workdir", default="demo-run", help="where config, database and logs go (default ./demo-run)")
    m.set_defaults(func=cmd_demo)
