"""``tuner workload`` and ``tuner tune`` (use case: tuner/app/tune.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import timedelta
from typing import Any

import yaml

from tuner.app.tune import TuneRequest, tune, workload_of
from tuner.cli.common import duration, float_in, int_in, session, table
from tuner.cli.progress import Heartbeat
from tuner.config import parse_duration
from tuner.signals.workload import describe, dump_workload
from tuner.store.tuning import TrialStatus

__all__ = ["add_parsers"]

_DEFAULT = TuneRequest("")  # the use case's defaults are the command's


def cmd_workload(args: argparse.Namespace) -> int:
    s = session(args)
    w = workload_of(s.cfg, s.store, args.target, window_s=args.window.total_seconds(), path=None, now=time.time())
    text = (
        "# tuner workload: what "
        + args.target
        + " served (docs/tune.md, 'Workload files')\n"
        + yaml.safe_dump(dump_workload(w), sort_keys=False)
    )
    if args.output and args.output != "-":
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
        print(
            f"wrote {args.output}: {w.input_len} in / {w.output_len} out tokens, "
            f"{w.rate_rps or 0:.3g} req/s offered, burstiness {w.burstiness:g}, from {w.requests} requests"
        )
        print("what the window proves about each value [low .. high]:")
        for line in describe(w):
            print("  " + line)
    else:
        print(text, end="")
    return 0


def _num(v: Any, unit: str = "", digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}g}{unit}"


def cmd_tune(args: argparse.Namespace) -> int:
    s = session(args)
    req = TuneRequest(
        args.target,
        workload_file=args.workload,
        window_s=args.window.total_seconds(),
        budget=args.budget,
        max_time_s=args.max_time.total_seconds(),
        flags=tuple(f.strip() for f in (args.flags or "").split(",") if f.strip()),
        resume=args.resume,
        on_target=args.on_target,
        run_s=args.run_seconds,
        max_runs=args.max_runs,
        tolerance=args.tolerance,
        noise_check=not args.no_noise_check,
        seed=args.seed,
        sampler=args.sampler,
        client_python=args.client_python,
        tokenizer=args.tokenizer,
        cpu_bind=args.cpu_bind,
        compare_pairs=args.compare_pairs,
    )
    waiting: list[str] = []
    hb = Heartbeat(lambda: waiting[0] if waiting else None, out=sys.stderr if args.json else None)
    with hb:
        result = tune(s.cfg, s.store, req, config_dir=s.config_dir, say=hb.say, waiting=waiting)
    if args.json:
        print(json.dumps(result, default=str))
        return 0
    print("\n".join(result_lines(result)))
    return 0


def result_lines(result: dict[str, Any]) -> list[str]:
    """What `tuner tune` prints of its result: the ranked table (each capacity measured one after the other, with its
    interval and where attainment crossed the objective between the rates tried; the two configs compared in turns
    say how they fared there), then what was pruned or not a candidate, the comparison and the verdict."""
    out: list[str] = []
    rows = [["#", "flags", "capacity@SLO", "interval", "crossing", "vs best", "P99 TTFT", "P99 E2E", "status", "note"]]
    for i, tr in enumerate(result["trials"], 1):
        flags = " ".join(f"{k}={v}" for k, v in tr["flags"].items())
        lo, hi = tr.get("interval") or (None, None)
        interval = "-" if lo is None else f"{lo:.3g}-{_num(hi) if hi is not None else 'ceiling'}"
        rows.append(
            [
                str(i),
                flags,
                _num(tr["capacity_rps"], " req/s"),
                interval,
                _num(tr.get("crossing_rps")),
                tr.get("vs_best", "-") + (f", {tr['in_turns']} in turns" if tr.get("in_turns") else ""),
                _num(tr["ttft_p99"], "s"),
                _num(tr["e2e_p99"], "s"),
                tr["status"] + (f" ({tr['seed']})" if tr["seed"] else ""),
                tr["note"][:60],
            ]
        )
    out.append(table(rows))
    for g in result.get(TrialStatus.PRUNED) or []:
        out.append(
            f"pruned {g['count']} x {g['kind']}{' (the flags in force among them)' if g['flags_in_force'] else ''}"
            f": e.g. {g['reason']}"
        )
    for nc in result.get("not_candidates") or []:
        out.append(f"not a candidate: {' '.join(f'{k}={v}' for k, v in nc['diff'].items())}: {nc['why']}")
    base, best = result["baseline"], result["best"]
    out.append(
        f"baseline: {_num(base['capacity_rps'], ' req/s')} within the SLO; best: "
        f"{_num(best['capacity_rps'] if best else None, ' req/s')}"
        + (
            " (one after the other; the verdict below weighs the comparison in turns)"
            if result.get("comparison")
            else ""
        )
    )
    if result.get("comparison"):
        c = result["comparison"]
        out.append(f"compared in turns ({_pairs(c)}): {c['outcome']}: {c['reason']}")
    out.append(f"verdict: {result.get('verdict', '-')}")
    if result.get("recommendation_id"):
        out.append(
            f"stored as recommendation #{result['recommendation_id']}: "
            f"tuner apply-recommendation {result['recommendation_id']}"
        )
    return out


def add_parsers(sub: Any) -> None:
    w = sub.add_parser("workload", help="the workload a vLLM target served, as a file tuner tune replays")
    w.add_argument("target")
    w.add_argument("--window", type=duration, default=parse_duration("1h"), help="stored window (default 1h)")
    w.add_argument("-o", "--output", help="write here (default: print)")
    w.set_defaults(func=cmd_workload)

    t = sub.add_parser(
        "tune", help="measure candidate flags on trial servers and find the most traffic within the SLO (docs/tune.md)"
    )
    t.add_argument("target")
    t.add_argument("--workload", metavar="FILE", help="workload file (default: what the target served in --window)")
    t.add_argument(
        "--window",
        type=duration,
        default=timedelta(seconds=_DEFAULT.window_s),
        help=f"stored window the workload is read from (default {_DEFAULT.window_s / 3600:g}h)",
    )
    t.add_argument(
        "--budget",
        type=int_in(1, 10_000),
        default=_DEFAULT.budget,
        help="trials that start a server, the comparison in turns counted as one (default %(default)s)",
    )
    t.add_argument(
        "--max-time",
        type=duration,
        default=timedelta(seconds=_DEFAULT.max_time_s),
        help=f"stop starting trials after this long (default {_DEFAULT.max_time_s / 3600:g}h)",
    )
    t.add_argument(
        "--flags",
        help="comma-separated flags to search, each NAME or NAME=V1/V2/... (default: every "
        "searchable one on this host, over tuner's own value ladders)",
    )
    t.add_argument(
        "--run-seconds",
        type=float_in(0, 86400, low_open=True),
        default=_DEFAULT.run_s,
        help="seconds of load per rate tried (default %(default)g)",
    )
    t.add_argument(
        "--max-runs",
        type=int_in(1, 1000),
        default=_DEFAULT.max_runs,
        help="rate runs per trial's capacity search (default %(default)s)",
    )
    t.add_argument(
        "--tolerance",
        type=float_in(0, 1, low_open=True),
        default=_DEFAULT.tolerance,
        help="a capacity search stops once the rate that met the SLO and the one that missed it are this close "
        "(0.15: within 15%%), and a winner measured one after the other must gain this much (default %(default)g)",
    )
    t.add_argument(
        "--no-noise-check",
        action="store_true",
        help="do not compare the winner with the flags in force "
        "in turns (then a winner must beat them beyond both capacities' intervals)",
    )
    t.add_argument(
        "--compare-pairs",
        type=int_in(1, 100),
        default=_DEFAULT.compare_pairs,
        help="turns of the best other config measured (the winner, or the runner-up when the flags in force "
        "measured highest) against the flags in force (A B, B A, ...) before 'no difference measurable' "
        "(default %(default)s)",
    )
    t.add_argument(
        "--cpu-bind",
        choices=["spread", "vllm"],
        default=_DEFAULT.cpu_bind,
        help="spread: a vLLM CPU trial's worker on cores no other process is pinned to, the benchmark "
        "client on the others (default); vllm: vLLM's own binding (every worker on the same core)",
    )
    t.add_argument(
        "--client-python",
        help="a Python with vllm installed, for vLLM's benchmark client (default: "
        "the vLLM target's managed.executable; needed for llama-server)",
    )
    t.add_argument(
        "--tokenizer",
        help="Hugging Face tokenizer (directory or hub name) the client writes prompts with "
        "(default: the vLLM target's model; needed for llama-server)",
    )
    t.add_argument("--resume", action="store_true", help="continue the target's last tuning run")
    t.add_argument(
        "--on-target",
        action="store_true",
        help="run the trials on the target itself, only inside one of its apply.maintenance_windows: "
        "production is drained for them and started again with the flags in force after (by the "
        "next tuner's reconcile if this one dies); for hosts where a second server does not fit",
    )
    t.add_argument(
        "--sampler",
        choices=["tpe", "random", "grid"],
        default=_DEFAULT.sampler,
        help="tpe: optuna's TPE seeded with the flags in force and the advisor's proposals, after an "
        "exponential search along max-num-seqs (--parallel) whose first step is long when the best "
        "so far queued requests, and whose steps up bring along the max-num-batched-tokens (-c) the "
        "added sequences (slots) need (default); random: optuna's random sampler; grid: every feasible "
        "point (budget permitting)",
    )
    t.add_argument(
        "--seed", type=int_in(0, 2**32 - 1), default=_DEFAULT.seed, help="the sampler's seed (default %(default)s)"
    )
    t.add_argument("--json", action="store_true", help="the result as JSON on stdout (progress on stderr)")
    t.set_defaults(func=cmd_tune)


def _pairs(c: dict[str, Any]) -> str:
    """How many pairs of runs a comparison in turns took, of how many requests; at which rates when it moved."""
    runs = (c.get("runs") or {}).get("A") or []
    by_rate: dict[float, list[int]] = {}
    for r in runs:
        by_rate.setdefault(r["rate_rps"], []).append(r["sent"])
    if len(by_rate) < 2:
        return f"{c.get('pairs', 0)} pairs of {c.get('requests_per_run', '?')} requests"
    return f"{c.get('pairs', 0)} pairs: " + ", ".join(
        f"{len(sent)} at {rate:.3g} req/s ({max(sent)} requests a run)" for rate, sent in by_rate.items()
    )
