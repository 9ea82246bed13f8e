"""The same flags on fresh vLLM CPU servers, one after another: how far apart `tuner tune` measures their capacity.

Issue 40's goal: five fresh servers with the same flags measure within ±10% of their mean, on an otherwise idle host
and with a neighbour process using half a core (in shadow mode production's own traffic is that neighbour). Each
server is one `tuner tune --budget 1` (the flags in force only: a fresh trial server, its warm-up run, the capacity
bracket of tuner/tune/capacity.py with vLLM's benchmark client), so what is measured is exactly what a tuning run
measures for one trial. Conditions are interleaved (server 1 of each condition, then server 2 of each, ...), so a
host that gets busier over the run weighs on every condition alike:

  --bind spread   tuner's placement (tuner/tune/cores.py): the trial's vLLM worker on cores no other process is
                  pinned to, the benchmark client on the others
  --bind vllm     vLLM's own binding (VLLM_CPU_OMP_THREADS_BIND=auto: every vLLM worker on the same core)
  --neighbour on  a process that burns half a core (busy 10 ms, asleep 10 ms), left where the kernel puts it, in a
                  session of its own (as production's server is)

For each server it records where the worker's OpenMP threads were bound (vLLM's own "OpenMP thread binding info"
log line) and the capacity with its interval; for each condition the mean, the spread ((max - min) / mean) and the
largest deviation from the mean, and whether every server is within ±10%.

  python bench/tune_spread.py                                   # 5 servers x {spread, vllm} x {idle, neighbour}
  python bench/tune_spread.py --servers 2 --bind spread,vllm --neighbour off --run-seconds 6 --max-runs 3  # smoke
  ... --run-seconds 60 --max-runs 7 --tolerance 0.05             # longer runs, a 5% bracket: ~8 min a server
  ... --write                                                   # also bench/results/<stamp>-tune-spread.md
  ... --workload-file bench/corpus/rag.yaml --flags max_num_seqs=32,max_num_batched_tokens=256
                                                  # a corpus shape (bench/tune_corpus.py), with the corpus's SLO
Needs TUNER_VLLM_PYTHON and TUNER_TINY_MODEL (scripts/setup-real-servers.sh prints them). ~3 min a server here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORKLOAD = {"input_len": 128, "output_len": 64, "range_ratio": 0.3, "burstiness": 1.0, "rate_rps": 2.0}
SLO = "{ttft_p99: 1s, e2e_p99: 4s, objective: 0.95}"
NEIGHBOUR = (
    "import time\nwhile True:\n    t = time.perf_counter()\n    while time.perf_counter() - t < 0.01:\n"
    "        pass\n    time.sleep(0.01)\n"
)


def vllm_and_model() -> tuple[str, str]:
    """The vLLM install's Python and the tiny model, from the exports of scripts/setup-real-servers.sh."""
    python, model = os.environ.get("TUNER_VLLM_PYTHON"), os.environ.get("TUNER_TINY_MODEL")
    if not python or not model:
        sys.exit("set TUNER_VLLM_PYTHON and TUNER_TINY_MODEL (eval the exports of scripts/setup-real-servers.sh)")
    return python, model


def parse_flags(text: str) -> dict:
    """``NAME=V,...`` as the flags in force (digits as ints; '' for vLLM's defaults)."""
    return {k: int(v) if v.isdigit() else v for k, v in (f.split("=", 1) for f in text.split(",") if f)}


def write_config(work: Path, python: str, model: str, flags: dict, workload: str, slo: str, nice: int) -> Path:
    (work / "workload.yaml").write_text(workload)
    cfg = work / f"tuner-nice{nice}.yaml"
    cfg.write_text(
        f"store: {{url: 'sqlite:///{work / 'tuner.db'}'}}\n"
        "targets:\n"
        f"  - name: tiny\n    backend: vllm\n    url: http://127.0.0.1:1\n    slo: {slo}\n"
        "    managed:\n"
        f"      model: {model}\n      executable: {python}\n"
        f"      flags: {{{', '.join(f'{k}: {json.dumps(v)}' for k, v in {**flags, 'max_model_len': 1024}.items())}}}\n"
        "      extra_args: {enforce-eager: true}\n"
        f"      log_dir: {work / 'logs'}\n"
        f"      engine_core_nice: {nice}\n"
        f"      env: {{VLLM_CPU_KVCACHE_SPACE: '1', HF_HUB_OFFLINE: '1', VLLM_CACHE_ROOT: '{work / 'vllm-cache'}'}}\n"
    )
    return cfg


def bound_cores(log: str) -> str:
    """Where vLLM bound its worker's OpenMP threads, from its own log ("local_rank=0, core ids=[1]")."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return "?"
    found = re.findall(r"local_rank=0, core ids=\[([0-9, ]*)\]", text)
    return found[-1].replace(" ", "") if found else "?"


def one_server(cfg: Path, work: Path, bind: str, args: argparse.Namespace, tag: str) -> dict:
    argv = [
        sys.executable,
        "-m",
        "tuner.cli",
        "-c",
        str(cfg),
        "tune",
        "tiny",
        "--workload",
        str(work / "workload.yaml"),
        "--budget",
        "1",
        "--no-noise-check",
        "--cpu-bind",
        bind,
        "--run-seconds",
        str(args.run_seconds),
        "--max-runs",
        str(args.max_runs),
        "--tolerance",
        str(args.tolerance),
        "--json",
    ]
    t0 = time.monotonic()
    from tuner.apply.launch import die_with_parent_hook

    with open(work / f"{tag}.log", "w") as log:
        out = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            preexec_fn=die_with_parent_hook,  # a stopped bench leaves no search, nor its trial servers, running
        )
    if out.returncode != 0:
        return {"tag": tag, "error": f"tuner tune exited {out.returncode}; see {work / (tag + '.log')}"}
    result = json.loads(out.stdout)
    from tuner.app.tune import _interval
    from tuner.store import tuning as tj
    from tuner.store.db import open_engine

    engine = open_engine(f"sqlite:///{work / 'tuner.db'}")
    trial = tj.trials(engine, result["run_id"])[0]
    engine.dispose()
    return {
        "tag": tag,
        "capacity_rps": trial.capacity_rps,
        "interval": _interval(trial.detail),  # as `tuner tune` reports it: the miss at the met rate's speed
        "speed_spread": trial.detail.get("speed_spread"),
        "crossing_rps": trial.detail.get("crossing_rps"),  # where its runs crossed the objective
        "worker_cores": bound_cores(trial.detail.get("log", "")),
        "placement": (trial.detail.get("placement") or {}).get("note", "vLLM's own (auto)"),
        "wall_s": round(time.monotonic() - t0, 1),
        "load": round(os.getloadavg()[0], 2),
    }


def deviation(x: float) -> str:
    """A worst deviation as the table shows it: whole percent, one decimal near the ±10% bar, where rounding would
    hide which side of it the value lies (10.2% is not within ±10%)."""
    return f"±{x:.1%}" if 0.095 <= x < 0.105 and abs(x - 0.1) > 1e-12 else f"±{x:.0%}"


def spread_of(values: list[float]) -> dict:
    """The mean, the spread ((max - min) / mean), the worst deviation from the mean and whether all lie within ±10%."""
    if not values:
        return {"n": 0}
    mean = statistics.fmean(values)
    return {
        "n": len(values),
        "mean": mean,
        "spread": (max(values) - min(values)) / mean,
        "worst": max(abs(c - mean) for c in values) / mean,
        "within_10": all(abs(c - mean) <= 0.1 * mean for c in values),
    }


def summarize(rows: list[dict]) -> dict:
    """The capacities' spread_of, and whether one rate lies inside every server's interval: then no two of them rank
    apart."""
    measured = [r for r in rows if r.get("capacity_rps")]
    s = spread_of([r["capacity_rps"] for r in measured])
    if s["n"]:
        s["overlap"] = max(r["interval"][0] or 0 for r in measured) < min(
            r["interval"][1] or math.inf for r in measured
        )
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=5)
    ap.add_argument("--bind", default="spread,vllm", help="comma-separated: spread, vllm")
    ap.add_argument("--neighbour", default="off,on", help="comma-separated: off, on")
    ap.add_argument(
        "--flags",
        default="max_num_seqs=4",
        help="the flags in force, NAME=V,... ('': vLLM's defaults; default %(default)s)",
    )
    ap.add_argument("--run-seconds", type=float, default=10.0)
    ap.add_argument("--max-runs", type=int, default=5)
    ap.add_argument("--tolerance", type=float, default=0.15, help="tune's --tolerance: the bracket width it stops at")
    ap.add_argument(
        "--workload-file", help="a workload file (`tuner workload` wrote one from a store: bench/corpus/*.yaml)"
    )
    ap.add_argument("--slo", help=f"the SLO (default {SLO}; with --workload-file the corpus's, bench/tune_corpus.py)")
    ap.add_argument(
        "--engine-core-nice",
        default="10",
        help="comma-separated: the trial servers' managed.engine_core_nice (default %(default)s, tuner's; 0: as vLLM "
        "starts)",
    )
    ap.add_argument("--workdir")
    ap.add_argument("--write", action="store_true", help="write bench/results/<stamp>-tune-spread.md")
    args = ap.parse_args()
    python, model = vllm_and_model()
    flags = parse_flags(args.flags)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tune-spread-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.workload_file:
        from bench.tune_corpus import SLO as CORPUS_SLO

        workload_text, workload, slo = Path(args.workload_file).read_text(), args.workload_file, CORPUS_SLO
    else:
        workload_text, workload, slo = "".join(f"{k}: {v}\n" for k, v in WORKLOAD.items()), str(WORKLOAD), SLO
    slo = args.slo or slo
    nices = [int(x) for x in args.engine_core_nice.split(",")]
    cfgs = {n: write_config(work, python, model, flags, workload_text, slo, n) for n in nices}
    subprocess.run(
        [sys.executable, "-m", "tuner.cli", "-c", str(cfgs[nices[0]]), "db", "upgrade"],
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    conditions = [(b, n, c) for c in nices for n in args.neighbour.split(",") for b in args.bind.split(",")]
    started = datetime.now(timezone.utc)
    load0 = os.getloadavg()[0]
    print(
        f"flags {flags}; workload {workload}; SLO {slo}; conditions {conditions}; {args.servers} servers each; "
        f"workdir {work}; load average {load0:.2f}",
        flush=True,
    )
    rows: dict[tuple[str, str, int], list[dict]] = {c: [] for c in conditions}
    for i in range(args.servers):
        for bind, neighbour, nice in conditions:
            # a session of its own, as production's server (or any other program on the host) has: with CFS
            # autogroup on, the kernel shares the CPU between sessions first (docs/tune.md, "Sessions")
            noisy = (
                subprocess.Popen([sys.executable, "-c", NEIGHBOUR], start_new_session=True)
                if neighbour == "on"
                else None
            )
            try:
                r = one_server(cfgs[nice], work, bind, args, f"{bind}-{neighbour}-nice{nice}-{i + 1}")
            finally:
                if noisy is not None:
                    noisy.send_signal(signal.SIGTERM)
                    noisy.wait()
            rows[(bind, neighbour, nice)].append(r)
            print(json.dumps(r), flush=True)
    lines = [
        f"## `tuner tune`: the same flags on {args.servers} fresh vLLM CPU servers ({started:%Y-%m-%d %H:%M} UTC)",
        "",
        f"`python bench/tune_spread.py --servers {args.servers} --bind {args.bind} --neighbour {args.neighbour} "
        f"--flags {args.flags} --run-seconds {args.run_seconds:g} --max-runs {args.max_runs} "
        f"--tolerance {args.tolerance:g} --engine-core-nice {args.engine_core_nice}"
        f"{' --workload-file ' + args.workload_file if args.workload_file else ''}`; "
        f"workload {workload}, SLO {slo}; load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
        f"{os.cpu_count()} CPUs.",
        "",
        "| binding | neighbour (half a core) | engine core nice | capacities, req/s (interval) | worker's cores | mean | spread "
        "(max-min)/mean | worst deviation | all within ±10% | intervals share a rate | host speed spread in a trial | "
        "minutes a trial | crossings, req/s | their mean, worst deviation, all within ±10% |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (bind, neighbour, nice), rs in rows.items():
        s = summarize(rs)
        caps = ", ".join(
            f"{r['capacity_rps']:.3g} ({r['interval'][0] or 0:.3g}-"
            f"{'ceiling' if r['interval'][1] is None else format(r['interval'][1], '.3g')})"
            if r.get("capacity_rps") is not None
            else r.get("error", "-")
            for r in rs
        )
        cores = ", ".join(r.get("worker_cores", "?") for r in rs)
        walls = [r["wall_s"] / 60 for r in rs if "wall_s" in r]
        minutes = f"{statistics.fmean(walls):.1f}" if walls else "-"
        speeds = ", ".join("-" if r.get("speed_spread") is None else f"{r['speed_spread'] - 1:.0%}" for r in rs)
        crossings = [r["crossing_rps"] for r in rs if isinstance(r.get("crossing_rps"), (int, float))]
        c = spread_of([x for x in crossings if x > 0])
        cross = (
            (", ".join(f"{x:.3g}" for x in crossings) or "-")
            + " | "
            + (f"{c['mean']:.3g}, {deviation(c['worst'])}, {'yes' if c['within_10'] else 'no'}" if c["n"] else "-")
        )
        if s["n"]:
            lines.append(
                f"| {bind} | {neighbour} | {nice} | {caps} | {cores} | {s['mean']:.3g} | {s['spread']:.0%} | "
                f"{deviation(s['worst'])} | {'yes' if s['within_10'] else 'no'} | {'yes' if s['overlap'] else 'no'} | "
                f"{speeds} | {minutes} | {cross} |"
            )
        else:
            lines.append(
                f"| {bind} | {neighbour} | {nice} | {caps} | {cores} | - | - | - | no | - | {speeds} | {minutes} |"
                f" {cross} |"
            )
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.write:
        from bench.summary import results_path

        path = results_path("tune-spread", started)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
