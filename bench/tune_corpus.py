"""Issue 40's corpus: six workload shapes nobody tuned for, each served to a real vLLM CPU server under `tuner run`
and read back by `tuner workload` from the store (never written by hand), for bench/tune.py to score on.

For each shape: a fresh config whose one target is a managed vLLM (the tiny local model, vLLM's defaults +
--max-model-len 1024), `tuner run` (which starts it and scrapes it every 5 s into the store), the shape's traffic
from vLLM's own benchmark client (tuner/tune/bench.py: random dataset, --request-rate, --burstiness,
--random-prefix-len) for --seconds, then `tuner workload tiny --window ...` writes <out>/<shape>.yaml with what the
store says was served (and how sure it is of each value). Then tuner and vLLM stop.

  rag             80% of the prompt a shared 600-token system prompt, prompts 650-850, outputs 40-120: near
                  max-model-len 1024 (the issue's own case)
  short-chat      64 in / 64 out, wide spread, 4 req/s
  long-gen        64 in / 512 out: generation-bound
  bursty          128 in / 64 out, gamma-distributed arrivals with shape 0.2
  mixed           300 in / 150 out, lengths spread over 0.1x-1.9x
  tiny-out        256 in / 4 out: prefill-bound

  python bench/tune_corpus.py --out bench/corpus [--shapes rag,bursty] [--seconds 150]
  python bench/tune_corpus.py --out bench/corpus --hold-out 2 --seed 7   # also picks the held-back third, first
Afterwards, for each shape and each starting point (vLLM's defaults, a poor config), bench/tune.py scores the search:
  python bench/tune.py --workload-file bench/corpus/rag.yaml --name rag --in-force '{"max_num_seqs": 2}'
The held-back shapes (<out>/holdout.json, chosen before any tuning) are reported separately. With each bench/tune.py
workdir named <shape>.<start> under one folder (start: defaults or poor; the poor start reuses the grid with
--skip grid after copying grid.json), one table scores them all, the held-back shapes apart:
  python bench/tune_corpus.py --score /tmp/tune-corpus --holdout bench/corpus/holdout.json
Needs TUNER_VLLM_PYTHON and TUNER_TINY_MODEL (scripts/setup-real-servers.sh prints them). ~4 min a shape here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.tune import Servers, key  # noqa: E402  (a config's identity, as tune.py scores it; its servers)
from tuner.lab.proc import stop  # noqa: E402

# name: (workload the client sends (its fields as tuner's workload files spell them), request rate)
SHAPES: dict[str, dict] = {
    "rag": {
        "input_len": 750,
        "prefix_len": 600,
        "output_len": 80,
        "range_ratio": 0.133,
        "burstiness": 1.0,
        "rate_rps": 3.0,
    },
    "short-chat": {"input_len": 64, "output_len": 64, "range_ratio": 0.5, "burstiness": 1.0, "rate_rps": 4.0},
    "long-gen": {"input_len": 64, "output_len": 512, "range_ratio": 0.3, "burstiness": 1.0, "rate_rps": 0.5},
    "bursty": {"input_len": 128, "output_len": 64, "range_ratio": 0.3, "burstiness": 0.2, "rate_rps": 3.0},
    "mixed": {"input_len": 300, "output_len": 150, "range_ratio": 0.9, "burstiness": 1.0, "rate_rps": 2.0},
    "tiny-out": {"input_len": 256, "output_len": 4, "range_ratio": 0.3, "burstiness": 1.0, "rate_rps": 6.0},
}
SLO = "{ttft_p99: 2s, e2e_p99: 20s, objective: 0.95}"


def draw_shapes(n: int, seed: int) -> dict[str, dict]:
    """``n`` shapes nobody designed, drawn at random (``--draw``), to hold back when the six above have been spent:
    lengths log-uniform (prompts 16-700 tokens, outputs 2-600), a spread of 0-0.9, arrivals from bursty (gamma
    shape 0.2) to regular (2), 0.3-6 req/s, and a third of them with a shared prefix of 30-80% of the prompt; every
    request within the corpus's max-model-len of 1024 (prompt + output at the top of their spread <= 1000)."""
    rng = random.Random(seed)
    out: dict[str, dict] = {}
    while len(out) < n:
        input_len = round(math.exp(rng.uniform(math.log(16), math.log(700))))
        output_len = round(math.exp(rng.uniform(math.log(2), math.log(600))))
        range_ratio = round(rng.uniform(0.0, 0.9), 2)
        if (input_len + output_len) * (1 + range_ratio) > 1000:
            continue  # redrawn: it would not fit max-model-len
        shape = {
            "input_len": input_len,
            "output_len": output_len,
            "range_ratio": range_ratio,
            "burstiness": round(math.exp(rng.uniform(math.log(0.2), math.log(2.0))), 2),
            "rate_rps": round(math.exp(rng.uniform(math.log(0.3), math.log(6.0))), 2),
        }
        if rng.random() < 1 / 3:
            shape["prefix_len"] = round(input_len * rng.uniform(0.3, 0.8))
        out[f"drawn-{seed % 10000}-{len(out) + 1}"] = shape
    return out


def _tuner(cfg: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", "-c", str(cfg), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        **kw,
    )


def _healthy(url: str) -> bool:
    from tuner.collect import http

    try:
        return http.get(url + "/health", timeout_s=3, max_bytes=1024).status == 200
    except Exception:  # noqa: BLE001 (not up yet)
        return False


def serve_shape(name: str, out: Path, python: str, model: str, seconds: float) -> dict:
    from tuner.apply.launch import free_port
    from tuner.config import Slo
    from tuner.signals.workload import Workload
    from tuner.tune.bench import BenchClient

    work = Path(tempfile.mkdtemp(prefix=f"corpus-{name}-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cfg = work / "tuner.yaml"
    cfg.write_text(
        f"store: {{url: 'sqlite:///{work / 'tuner.db'}'}}\n"
        f"listen: 127.0.0.1:{free_port()}\n"
        "defaults: {scrape_interval: 5s, scrape_timeout: 5s}\n"
        "targets:\n"
        f"  - name: tiny\n    backend: vllm\n    url: {url}\n    slo: {SLO}\n"
        "    managed:\n"
        f"      model: {model}\n      executable: {python}\n"
        "      flags: {max_model_len: 1024}\n"
        f"      log_dir: {work / 'logs'}\n"
        f"      env: {{VLLM_CPU_KVCACHE_SPACE: '1', HF_HUB_OFFLINE: '1', VLLM_CACHE_ROOT: '{work / 'vllm-cache'}'}}\n"
    )
    _tuner(cfg, "db", "upgrade", check=True)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "-c", str(cfg), "--log-level", "WARNING", "run"],
        stdout=open(work / "run.log", "w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 600
        while not _healthy(url):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name}: the managed vLLM did not come up; see {work / 'run.log'}, {work / 'logs'}")
            time.sleep(2)
        time.sleep(12)  # two scrapes of the idle server before the traffic
        shape = SHAPES[name]
        w = Workload(**{k: v for k, v in shape.items()})
        t0 = time.time()
        with BenchClient(python, work / "client") as client:
            run = client.run(
                w,
                url=url,
                model="tiny",
                tokenizer=model,
                rate=shape["rate_rps"],
                prompts=max(30, int(shape["rate_rps"] * seconds)),
                slo=Slo(e2e_p99="20s"),
                warmups=0,
                timeout_s=seconds * 4 + 300,
            )
        time.sleep(12)  # the last requests' scrape
        window = int(time.time() - t0) + 5
        path = out / f"{name}.yaml"
        got = _tuner(cfg, "workload", "tiny", "--window", f"{window}s", "-o", str(path))
        if got.returncode != 0:
            raise SystemExit(f"{name}: tuner workload failed: {got.stderr.strip()}")
        print(got.stdout.strip(), flush=True)
        return {
            "shape": name,
            "sent": shape,
            "file": str(path),
            "client": {"sent": run.sent, "completed": run.completed, "throughput_rps": run.throughput_rps},
            "workdir": str(work),
        }
    finally:
        stop(daemon, 30)
        _tuner(cfg, "managed", "stop", timeout=120)


# what bench/tune.py gives every trial of a backend (not searched, so not shown), and what an empty config runs
_FIXED = {"vllm": ("max_model_len", "vLLM's defaults"), "llamacpp": ("ctx_size", "llama-server's defaults")}


def _flags(flags: dict, backend: str = "vllm") -> str:
    fixed, defaults = _FIXED[backend]
    return " ".join(f"{k}={v}" for k, v in flags.items() if k != fixed) or defaults


def score_run(work: Path) -> dict:
    """One bench/tune.py workdir (grid.json, tpe.json, random.json where it ran): tune's and random search's choice as
    a share of the grid's best (the grid's own capacity of the chosen point), trials as a share of the grid's,
    crashes, and every config measured in more than one of the runs (fresh servers each time) with its capacities."""
    runs = {
        s: json.loads((work / f"{s}.json").read_text())
        for s in ("grid", "tpe", "random")
        if (work / f"{s}.json").exists()
    }
    again: dict[str, list[float]] = {}
    flags_of: dict[str, dict] = {}
    for r in runs.values():
        for t in r["trials"]:
            if t["status"] == "measured":
                again.setdefault(key(t["flags"]), []).append(t["capacity_rps"])
                flags_of[key(t["flags"])] = t["flags"]
    # The truth a choice is scored by: the grid's capacity of each grid point; a config off the grid (the server's defaults,
    # which `--sampler grid` does not visit) by the mean of the searches' own measurements of it, marked as such.
    truth = {key(t["flags"]): t["capacity_rps"] for t in runs["grid"]["trials"] if t["status"] == "measured"}
    if not truth:
        raise SystemExit(f"{work}: the grid measured nothing")
    off_grid = {k: sum(v) / len(v) for k, v in again.items() if k not in truth}
    truth.update(off_grid)
    top = max(truth, key=lambda k: truth[k])

    def started(r: dict) -> int:
        return r["counts"]["measured"] + r["counts"]["crashed"]

    def chosen(r: dict) -> float | None:
        return truth[key(r["best"]["flags"])] / truth[top] if r["best"] else None

    def decided(r: dict) -> dict | None:
        """What tune told the user to run: the config its stored recommendation names (the one judged in turns, or
        the best), else the flags in force ("keep the flags in force")."""
        if r.get("recommendation_id") is None:
            return (r.get("baseline") or {}).get("flags")
        return ((r.get("comparison") or {}).get("flags")) or (r["best"] or {}).get("flags")

    same = {k: v for k, v in again.items() if len(v) > 1}
    # a capacity of 0 is a bound ("no rate down to the floor met the objective", or the run budget spent halving
    # from a far higher rate), not a reading: the repeat's spread is over the readings above 0
    read = {k: r for k, v in same.items() if len(r := [x for x in v if x > 0]) > 1}
    base = key(runs["tpe"]["baseline"]["flags"])
    tpe_key = key(runs["tpe"]["best"]["flags"]) if runs["tpe"]["best"] else None
    return {
        "backend": runs["grid"].get("backend", "vllm"),  # bench/tune.py records it (vLLM before --backend)
        "grid_best": truth[top],
        "grid_best_flags": flags_of[top],
        "grid_best_off_grid": top in off_grid,
        "grid_trials": started(runs["grid"]),
        "tpe": chosen(runs["tpe"]),
        "tpe_flags": (runs["tpe"]["best"] or {}).get("flags"),
        "tpe_off_grid": tpe_key in off_grid,
        "tpe_trials": started(runs["tpe"]),
        "tpe_decision": (
            truth[key(d)] / truth[top] if (d := decided(runs["tpe"])) is not None and key(d) in truth else None
        ),
        "tpe_decision_flags": decided(runs["tpe"]),
        "tpe_decision_off_grid": key(decided(runs["tpe"]) or {}) in off_grid,
        "random": chosen(runs["random"]) if "random" in runs else None,  # `bench/tune.py --skip random`: not run
        "random_trials": started(runs["random"]) if "random" in runs else None,
        "crashes": sum(r["counts"]["crashed"] for r in runs.values()),
        "baseline_again": same.get(base, []),
        "worst_repeat": max((max(abs(x / (sum(v) / len(v)) - 1) for x in v) for v in read.values()), default=None),
        "minutes": round(sum(r.get("wall_s", 0.0) for r in runs.values()) / 60, 1),
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def score(folder: Path, held: list[str]) -> str:
    """Issue 40 item 6's table over every <shape>.<start> workdir under folder, held-back shapes apart."""
    rows = []
    for work in sorted(p for p in folder.iterdir() if (p / "grid.json").exists() and (p / "tpe.json").exists()):
        shape, _, start = work.name.partition(".")
        rows.append((shape in held, shape, start or "-", score_run(work)))
    if not rows:
        raise SystemExit(f"{folder}: no bench/tune.py workdir (<shape>.<start> with grid.json and tpe.json)")
    out = [
        "| shape | set | from | grid best | tune's choice / grid best | tune's decision / grid best | tune's trials / "
        "grid's | random search's choice / grid best | crashes | the flags in force, measured again (in order) | "
        "worst repeat |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for h, shape, start, r in sorted(rows, key=lambda x: (x[0], x[1], x[2])):
        again = ", ".join(f"{x:.3g}" for x in r["baseline_again"]) or "-"
        star = {True: "*", False: ""}
        b = r["backend"]
        out.append(
            f"| {shape} | {'held back' if h else 'built on'} | {start} | {r['grid_best']:.3g} req/s "
            f"({_flags(r['grid_best_flags'], b)}{star[r['grid_best_off_grid']]}) | {_pct(r['tpe'])} "
            f"({_flags(r['tpe_flags'] or {}, b)}{star[r['tpe_off_grid']]}) | {_pct(r.get('tpe_decision'))} "
            f"({_flags(r.get('tpe_decision_flags') or {}, b)}{star[r.get('tpe_decision_off_grid', False)]}) | {r['tpe_trials']}/{r['grid_trials']} | {_pct(r['random'])} | {r['crashes']} | {again} | "
            f"{_pct(r['worst_repeat'])} |"
        )
    if any(r["grid_best_off_grid"] or r["tpe_off_grid"] for *_, r in rows):
        out.append(
            "\n\\* off the grid (the server's defaults: `--sampler grid` visits the grid's points only): its capacity "
            "is the mean of the searches' own measurements of it, and it counts as a candidate for the best."
        )
    for h in (False, True):
        part = [r for held_back, _, _, r in rows if held_back == h]
        if part:
            shares = sorted(r["tpe"] or 0.0 for r in part)
            trials = sum(r["tpe_trials"] for r in part) / sum(r["grid_trials"] for r in part)
            out.append(
                f"\n{'Held back' if h else 'Built on'} ({len(part)} runs): tune's choice reaches "
                f"{shares[0]:.0%}-{shares[-1]:.0%} of the grid's best (at least 95% in "
                f"{sum(x >= 0.95 for x in shares)} of {len(shares)}) with {trials:.0%} of the grid's trials."
            )
            said = sorted(r["tpe_decision"] or 0.0 for r in part)
            out.append(
                f"What tune told the user to run (its recommendation, else the flags in force) reaches "
                f"{said[0]:.0%}-{said[-1]:.0%} of the grid's best (at least 95% in {sum(x >= 0.95 for x in said)} "
                f"of {len(said)})."
            )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/corpus")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated (default: all six)")
    ap.add_argument("--seconds", type=float, default=150.0, help="traffic per shape (default %(default)s)")
    ap.add_argument("--hold-out", type=int, default=0, help="pick this many shapes to hold back, before any tuning")
    ap.add_argument(
        "--draw", type=int, default=0, help="draw this many new random shapes (all held back) and serve only them"
    )
    ap.add_argument("--seed", type=int, default=None, help="for --hold-out and --draw (default: from the clock)")
    ap.add_argument("--score", metavar="DIR", help="print the table of the bench/tune.py workdirs under DIR")
    ap.add_argument("--holdout", help="with --score: the holdout.json the corpus was recorded with")
    args = ap.parse_args()
    if args.score:
        held = json.loads(Path(args.holdout).read_text())["held_out"] if args.holdout else []
        print(score(Path(args.score), held))
        return 0
    servers = Servers.from_env("vllm")  # the corpus is served to vLLM; exits naming what is unset
    python, model = servers.python, servers.model
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    seed = args.seed if args.seed is not None else time.time_ns()  # for --draw and --hold-out
    if args.draw:
        drawn = draw_shapes(args.draw, seed)
        SHAPES.update(drawn)
        names = sorted(drawn)
        (out / "drawn.json").write_text(json.dumps({"seed": seed, "shapes": drawn}, indent=1) + "\n")
        (out / "holdout.json").write_text(json.dumps({"seed": seed, "held_out": names}) + "\n")
        print(f"drawn and held back (seed {seed}): {json.dumps(drawn)}", flush=True)
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        sys.exit(f"--shapes: unknown {', '.join(unknown)} (choose from {', '.join(SHAPES)})")
    if args.hold_out and not args.draw:
        held = sorted(random.Random(seed).sample(sorted(SHAPES), args.hold_out))
        (out / "holdout.json").write_text(json.dumps({"seed": seed, "held_out": held}) + "\n")
        print(f"held back (chosen before any tuning, seed {seed}): {', '.join(held)}", flush=True)
    done = [serve_shape(n, out, python, model, args.seconds) for n in names]
    (out / "corpus.json").write_text(json.dumps(done, indent=1) + "\n")
    print(
        f"\nwrote {len(done)} workloads to {out}; score each with bench/tune.py --workload-file FILE --name NAME "
        "(once with --in-force '{}' for vLLM's defaults, once with a poor config)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
