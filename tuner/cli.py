"""The ``tuner`` command. Each user error prints one line and exits with its class's code; no tracebacks."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from tuner.config import Config, load_config, parse_duration
from tuner.errors import ConfigError, ScrapeError, TunerError

__all__ = ["main"]

DEFAULT_CONFIG = "tuner.yaml"


def _config_path(args: argparse.Namespace) -> str:
    return args.config or os.environ.get("TUNER_CONFIG") or DEFAULT_CONFIG


def _load(args: argparse.Namespace) -> Config:
    path = _config_path(args)
    if not Path(path).exists():
        raise ConfigError(path, "", "no such file; pass --config PATH or set TUNER_CONFIG "
                                    "(see README 'Config' for an example)")
    return load_config(path)


def _open_store(cfg: Config, *, check: bool = True):
    from tuner.store.db import check_schema, open_engine
    from tuner.store.store import Store

    engine = open_engine(cfg.store.url)
    if check:
        check_schema(engine)
    return Store(engine)


# ---- commands ----------------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> int:
    from tuner.daemon import Daemon
    from tuner.exporter import serve_metrics

    cfg = _load(args)
    store = _open_store(cfg)
    config_dir = Path(_config_path(args)).resolve().parent
    daemon = Daemon(cfg, store, config_dir=config_dir)
    host, port = cfg.listen_host_port
    server, _thread = serve_metrics(daemon.state, host, port, daemon=daemon, token=cfg.api.token(config_dir))
    log = logging.getLogger("tuner")
    log.info("tuner %d target(s); own metrics on http://%s:%d/metrics; store %s", len(cfg.targets), host, port,
             cfg.store.url)
    try:
        daemon.run_forever(max_seconds=args.duration.total_seconds() if args.duration else None)
    finally:
        server.shutdown()  # type: ignore[attr-defined]
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from tuner.store.db import current_revision, head_revision, open_engine, upgrade

    cfg = _load(args)
    engine = open_engine(cfg.store.url)
    if args.db_command == "upgrade":
        before, after = upgrade(engine)
        print(f"{cfg.store.url}: {before or 'empty'} -> {after}" if before != after
              else f"{cfg.store.url}: already at {after}")
    else:
        current, head = current_revision(engine), head_revision()
        print(f"{cfg.store.url}: {current or 'no schema'} (this tuner: {head})")
        return 0 if current == head else 1
    return 0


def _fmt(v: Any, scale: float = 1.0, unit: str = "", digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v * scale:.{digits}f}{unit}"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def cmd_status(args: argparse.Namespace) -> int:
    from tuner.signals.derive import compute_signals

    cfg = _load(args)
    store = _open_store(cfg)
    now = time.time()
    window = args.window.total_seconds()
    rows = [["TARGET", "BACKEND", "HEALTH", "ENGINE/MODEL", "KV%", "RUN/WAIT", "TTFT P99", "E2E P99", "LAST SCRAPE",
             "LAST ERROR"]]
    out_json = []
    known = set(store.target_names())
    for t in cfg.targets:
        if t.name not in known:
            rows.append([t.name, t.backend, "never", "-", "-", "-", "-", "-", "-", "not scraped yet"])
            continue
        sig = compute_signals(store.window(t.name, now - window, now), slo=t.slo)
        out_json.append(sig.as_json())
        h = sig.health
        age = f"{now - h.last_scrape_ms / 1000:.0f}s ago" if h else "-"
        err = (h.last_error[:60] + ("…" if len(h.last_error) > 60 else "")) if h and h.last_error else ""
        engines = sig.engines or ()
        if not engines:
            rows.append([t.name, t.backend, h.health if h else "-", "-", "-", "-", "-", "-", age, err])
        for e in engines:
            rows.append([t.name, t.backend, h.health if h else "-", f"{e.engine}/{e.model_name}",
                         _fmt(e.kv_cache_usage, 100, "%", 1),
                         f"{_fmt(e.requests_running, digits=0)}/{_fmt(e.requests_waiting, digits=0)}",
                         _fmt(e.ttft_p99, 1000, "ms", 0), _fmt(e.e2e_p99, 1, "s", 2), age, err])
    gpus = store.gpu_latest(max_age_s=max(60.0, 3 * cfg.gpu.interval.total_seconds()), now=now)
    if args.json:
        print(json.dumps({"targets": out_json, "gpus": [g.__dict__ for g in gpus]}, default=list))
        return 0
    print(f"tuner status — window {args.window.total_seconds():g}s, store {cfg.store.url}")
    print(_table(rows))
    if cfg.gpu.source == "none":
        print("\nGPU: telemetry disabled (gpu.source: none)")
    elif not gpus:
        reason = "no recent reading (is `tuner run` running?)"
        if cfg.gpu.source == "nvml":
            from tuner.collect.gpu import read_nvml

            reading = read_nvml(now)  # cheap, and says why (no driver, no device) when there is no GPU
            reason = reason if reading.available else reading.reason
        print(f"\nGPU ({cfg.gpu.source}): {reason}")
    else:
        grows = [["GPU", "NAME", "MEM USED", "MEM TOTAL", "UTIL", "TEMP", "POWER", "PROCESSES"]]
        for g in gpus:
            grows.append([str(g.index), g.name, _fmt(g.memory_used_bytes, 2**-30, " GiB", 1),
                          _fmt(g.memory_total_bytes, 2**-30, " GiB", 1), _fmt(g.utilization, 100, "%", 0),
                          _fmt(g.temperature_c, 1, "C", 0), _fmt(g.power_w, 1, "W", 0),
                          ", ".join(f"{pid}:{name or '?'}" for pid, name, _ in g.processes) or "-"])
        print()
        print(_table(grows))
    return 0


def cmd_signals(args: argparse.Namespace) -> int:
    from tuner.signals.derive import compute_signals

    cfg = _load(args)
    target = cfg.target(args.target)
    store = _open_store(cfg)
    now = args.at if args.at is not None else time.time()
    sig = compute_signals(store.window(target.name, now - args.window.total_seconds(), now), slo=target.slo)
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


def cmd_snapshot(args: argparse.Namespace) -> int:
    from tuner.collect import llamacpp, vllm
    from tuner.collect.exposition import decode_body

    now = time.time()
    if args.file:
        try:
            body = Path(args.file).read_bytes()
        except OSError as exc:
            raise ScrapeError(f"{args.file}: {exc.strerror or exc}") from None
        text = decode_body(body)
        if args.backend == "vllm":
            snap = vllm.snapshot_from_text(text, target=args.file, ts=now)
        else:
            slots = None
            if args.slots_file:
                try:
                    slots = llamacpp.parse_slots(Path(args.slots_file).read_bytes())
                except OSError as exc:
                    raise ScrapeError(f"{args.slots_file}: {exc.strerror or exc}") from None
            snap = llamacpp.snapshot_from_text(text, target=args.file, ts=now, slots=slots,
                                                  model_name=args.model_name or "llama-server")
    else:
        url = args.url.rstrip("/").removesuffix("/metrics")
        if args.backend == "vllm":
            snap = vllm.scrape(url, target=url, timeout_s=args.timeout, max_bytes=args.max_bytes, now=now)
        else:
            snap = llamacpp.scrape(url, target=url, timeout_s=args.timeout, max_bytes=args.max_bytes,
                                   model_name=args.model_name or "llama-server", now=now)
    for problem in snap.problems:
        print(f"tuner: warning: {problem}", file=sys.stderr)
    for e in snap.engines:
        obj = e.as_json()
        if args.json:
            print(json.dumps(obj))
        else:
            print(f"{obj.pop('model_name')} (engine {obj.pop('engine')}, {obj.pop('backend')})")
            for k, v in obj.items():
                print(f"  {k:32} {v if k != 'config' else json.dumps(v)}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from tuner.lab.demo import run_demo

    if not args.vllm_python or not args.model:
        raise ConfigError("tuner demo", "--vllm-python/--model", "both are needed; scripts/demo.sh installs "
                          "vLLM and makes a tiny model, then runs this")
    return run_demo(vllm_python=args.vllm_python, model=args.model, workdir=Path(args.workdir).resolve())


# ---- parser ------------------------------------------------------------------------------------

def _duration(text: str):
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tuner", description="Watch vLLM and llama-server, derive serving signals, "
                                "and tune their flags safely.")
    p.add_argument("--config", "-c", help=f"config file (default: $TUNER_CONFIG or ./{DEFAULT_CONFIG})")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("run", help="run the daemon: scrape targets and GPUs into the store, serve tuner's /metrics")
    r.add_argument("--for", dest="duration", type=_duration, help="stop after this long (e.g. 2m); default: "
                   "until SIGTERM/SIGINT")
    r.set_defaults(func=cmd_run)

    d = sub.add_parser("db", help="database schema: upgrade, or show the current revision")
    d.add_argument("db_command", choices=["upgrade", "current"])
    d.set_defaults(func=cmd_db)

    s = sub.add_parser("status", help="a table per target: health, KV use, running/waiting, P99 TTFT and E2E, GPU")
    s.add_argument("--window", type=_duration, default=parse_duration("5m"), help="signal window (default 5m)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.set_defaults(func=cmd_status)

    g = sub.add_parser("signals", help="derived signals of one target over a window")
    g.add_argument("target")
    g.add_argument("--window", type=_duration, default=parse_duration("5m"), help="window (default 5m)")
    g.add_argument("--at", type=float, help="evaluate at this unix time instead of now")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_signals)

    n = sub.add_parser("snapshot", help="scrape a server (or read a saved exposition) once and print what tuner "
                       "sees, one object per engine/model")
    src = n.add_mutually_exclusive_group(required=True)
    src.add_argument("url", nargs="?", help="server base URL, e.g. http://127.0.0.1:8000")
    src.add_argument("--file", help="a saved /metrics exposition")
    n.add_argument("--backend", choices=["vllm", "llamacpp"], required=True)
    n.add_argument("--slots-file", help="llama-server: a saved /slots JSON (derives slots and KV use)")
    n.add_argument("--model-name", help="llama-server: the model name to report (it serves no such label)")
    n.add_argument("--json", action="store_true", help="one JSON object per line")
    n.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    n.add_argument("--max-bytes", type=int, default=10 * 2**20, help="largest body accepted (default 10 MiB)")
    n.set_defaults(func=cmd_snapshot)
    m = sub.add_parser("demo", help="start a real vLLM on a tiny model, run tuner against it under load, "
                       "show what it sees (scripts/demo.sh sets it up)")
    m.add_argument("--vllm-python", default=os.environ.get("TUNER_VLLM_PYTHON"),
                   help="python of the venv that has vLLM (default $TUNER_VLLM_PYTHON)")
    m.add_argument("--model", default=os.environ.get("TUNER_TINY_MODEL"),
                   help="model directory (default $TUNER_TINY_MODEL)")
    m.add_argument("--workdir", default="demo-run", help="where config, database and logs go (default ./demo-run)")
    m.set_defaults(func=cmd_demo)
    from tuner.rules.cli import add_parsers as _alerts_parsers  # alerts list/history/check/export/test/signals

    _alerts_parsers(sub, {"load": _load, "open_store": _open_store, "table": _table})
    from tuner.advise.cli import add_parsers as _advise_parsers  # plan, recommend, recommendations

    _advise_parsers(sub, _duration, parse_duration("5m"))
    from tuner.apply.cli import add_parsers as _apply_parsers  # apply-recommendation, rollback, journal, managed

    _apply_parsers(sub, {"load": _load, "open_store": _open_store, "config_path": _config_path})
    from tuner.dashboards.cli import add_parsers as _dashboards_parsers  # dashboards generate/push

    _dashboards_parsers(sub)
    from tuner.report.cli import add_parsers as _report_parsers  # report -o report.html

    _report_parsers(sub, {"load": _load, "open_store": _open_store}, _duration, parse_duration("24h"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    if args.log_level != "DEBUG":
        logging.getLogger("alembic").setLevel(logging.WARNING)  # its per-command INFO lines are noise here
    try:
        return args.func(args)
    except TunerError as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
