"""Score `tuner tune` against the exhaustive grid and random search, on a real vLLM CPU server, per workload.

For one workload (below), three runs of the same command with the same capacity measure (vLLM's benchmark
client, tuner/tune/bench.py; capacity bracketing, tuner/tune/capacity.py), one after another on this machine:
  grid    `tuner tune --sampler grid`: every feasible point of the grid (the ground truth)
  tpe     `tuner tune --sampler tpe --budget B` (tuner's default: the flags in force first, then TPE)
  random  `tuner tune --sampler random --budget B` (the flags in force first, then optuna's random sampler)
with B = a quarter of the grid's points (rounded down, at least 2). Scores, for tpe and random:
  chosen/grid-best   the grid's capacity of the point the search chose / the grid's best capacity (the quality of
                     the choice, free of the search's own measurement luck)
  measured/grid-best the search's own measured best / the grid's best
  trials             servers started / the grid's; crashes (servers that failed to start) must be 0
vLLM's defaults: the grid's point with every searched flag at vLLM's default, where the grid holds it.

Fairness on 2 cores: tuner places each trial's vLLM worker on a core no other process is pinned to and the
benchmark client on the other (tuner/tune/cores.py; vLLM's own binding put every worker on core 0); nothing else of
the bench runs meanwhile (no production server: trials run on spare ports). Every config in all three searches is measured with that same client under the same contention.

  python bench/tune.py --workload chat            # all three, prints the table; ~40 min for a 12-point grid
  python bench/tune.py --workload-file bench/corpus/rag.yaml --name rag --in-force '{"max_num_seqs": 2}'
                                                  # a workload `tuner workload` read from a real store
                                                  # (bench/tune_corpus.py records six shapes)
  python bench/tune.py --backend llamacpp --workload-file bench/corpus/rag.yaml --in-force '{"parallel": 1}'
                                                  # the same on llama-server (the tiny model's GGUF)
Needs TUNER_VLLM_PYTHON and TUNER_TINY_MODEL (scripts/setup-real-servers.sh prints them); --backend llamacpp also
TUNER_LLAMA_SERVER and TUNER_TINY_BPE_GGUF.

llama-server: a managed target on the tiny model's GGUF with one compute thread (-t 1: the client gets the other
core; tuner places vLLM's workers on cores and leaves llama-server's threads to the kernel) and -c 16384, so that
each of up to 16 slots holds 1,024 tokens (the corpus's max-model-len) and no grid point is pruned for its slots.
Loaded by the same client (vLLM's, with the tiny model's tokenizer). The GGUF is the tiny llama written with that
tokenizer's BPE vocabulary (scripts/make_tiny_gguf.py --vocab-from), so llama-server counts each prompt as the client
and vLLM do; runs up to 141c147 used the byte vocabulary of the tests' GGUF, which spelled the same prompts in about
4x the tokens and overflowed slots on every config. The grid searches --parallel and -ub; `--in-force '{}'` is
llama-server's own defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

WORKLOADS = {
    # name: (workload file, SLO, flags searched with their values, the flags in force)
    "chat": (
        {"input_len": 128, "output_len": 128, "range_ratio": 0.3, "burstiness": 1.0, "rate_rps": 2.0},
        "{ttft_p99: 1s, e2e_p99: 4s, objective: 0.95}",
        "max_num_seqs=1/2/4/8/16/32,max_num_batched_tokens=256/2048",
        {"max_num_seqs": 2, "max_num_batched_tokens": 2048},
    ),
    "long-prompt": (
        {"input_len": 768, "output_len": 32, "range_ratio": 0.2, "burstiness": 1.0, "rate_rps": 1.0},
        "{ttft_p99: 2s, e2e_p99: 4s, objective: 0.95}",
        "max_num_seqs=1/2/4/8/16/32,max_num_batched_tokens=256/2048",
        {"max_num_seqs": 2, "max_num_batched_tokens": 2048},
    ),
    "shared-prefix": (
        {"input_len": 640, "prefix_len": 576, "output_len": 32, "range_ratio": 0.0, "burstiness": 1.0, "rate_rps": 1.0},
        "{ttft_p99: 2s, e2e_p99: 4s, objective: 0.95}",
        "max_num_seqs=1/2/4/8/16/32,enable_prefix_caching=false/true",
        {"max_num_seqs": 2, "enable_prefix_caching": False},
    ),
    # short answers and a 2 s TTFT budget: with 128-token answers and 1 s, one sequence met the SLO only at
    # 0.06 req/s and 30-request runs held too few bursts for a stable share
    # (bench/results/2026-11-24-0432-tune-bursty-chat.md)
    "bursty-chat": (
        {"input_len": 128, "output_len": 32, "range_ratio": 0.3, "burstiness": 0.25, "rate_rps": 2.0},
        "{ttft_p99: 2s, e2e_p99: 4s, objective: 0.95}",
        "max_num_seqs=1/2/4/8/16/32,max_num_batched_tokens=256/2048",
        {"max_num_seqs": 2, "max_num_batched_tokens": 2048},
    ),
}


# A workload read from a store (bench/tune_corpus.py): searched over these, from the flags given (--in-force).
FILE_SLO = "{ttft_p99: 2s, e2e_p99: 20s, objective: 0.95}"
FILE_GRID = "max_num_seqs=1/2/4/8/16/32,max_num_batched_tokens=256/2048"
LLAMA_GRID = "parallel=1/2/4/8/16,ubatch_size=128/512"
LLAMA_CTX = 16384  # 16 slots of 1,024 tokens


def add_file_workload(args: argparse.Namespace) -> str:
    """Register --workload-file (what `tuner workload` wrote) as a workload of its own; its name."""
    from tuner.signals.workload import parse_workload

    path = Path(args.workload_file)
    w = parse_workload(path.read_text(encoding="utf-8"), str(path))  # refuses a bad file by its key, as tune would
    if w.source != "store":
        sys.exit(f"{path}: source is {w.source!r}; --workload-file takes what `tuner workload` read from a store")
    name = args.name or path.stem
    grid = args.grid or (LLAMA_GRID if args.backend == "llamacpp" else FILE_GRID)
    WORKLOADS[name] = (path, args.slo or FILE_SLO, grid, json.loads(args.in_force or "{}"))
    return name


@dataclass(frozen=True)
class Servers:
    """What the trial servers run and the client loads them with."""

    backend: str  # vllm or llamacpp
    python: str  # vLLM's Python: its server, and the benchmark client for either backend
    model: str  # the tiny model's folder: vLLM's model, and the client's tokenizer
    llama_server: str | None = None
    gguf: str | None = None

    @classmethod
    def from_env(cls, backend: str) -> Servers:
        env = os.environ.get
        need = ["TUNER_VLLM_PYTHON", "TUNER_TINY_MODEL"]
        if backend == "llamacpp":
            need += ["TUNER_LLAMA_SERVER", "TUNER_TINY_BPE_GGUF"]
        missing = [n for n in need if not env(n)]
        if missing:
            sys.exit(f"set {', '.join(missing)} (eval the exports of scripts/setup-real-servers.sh)")
        return cls(
            backend, env("TUNER_VLLM_PYTHON", ""), env("TUNER_TINY_MODEL", ""),
            env("TUNER_LLAMA_SERVER"), env("TUNER_TINY_BPE_GGUF"),
        )  # fmt: skip


def write_config(work: Path, workload: str, servers: Servers) -> Path:
    wl, slo, _, current = WORKLOADS[workload]
    if isinstance(wl, Path):  # a file `tuner workload` wrote: replayed as it is
        (work / "workload.yaml").write_text(wl.read_text(encoding="utf-8"))
    else:
        (work / "workload.yaml").write_text("".join(f"{k}: {v}\n" for k, v in wl.items()))
    target = (
        f"  - name: tiny\n    backend: {servers.backend}\n    url: http://127.0.0.1:1\n    slo: {slo}\n    managed:\n"
    )
    if servers.backend == "llamacpp":
        flags = ", ".join(f"{k}: {json.dumps(v)}" for k, v in {"ctx_size": LLAMA_CTX, **current}.items())
        target += (
            f"      model: {servers.gguf}\n      executable: {servers.llama_server}\n"
            f"      flags: {{{flags}}}\n"
            "      extra_args: {'-t': 1}\n"
        )
    else:
        flags = ", ".join(f"{k}: {json.dumps(v)}" for k, v in {**current, "max_model_len": 1024}.items())
        target += (
            f"      model: {servers.model}\n      executable: {servers.python}\n"
            f"      flags: {{{flags}}}\n"
            "      extra_args: {enforce-eager: true}\n"
            f"      env: {{VLLM_CPU_KVCACHE_SPACE: '1', HF_HUB_OFFLINE: '1', VLLM_CACHE_ROOT: '{work / 'vllm-cache'}'}}\n"
        )
    cfg = work / "tuner.yaml"
    cfg.write_text(f"store: {{url: 'sqlite:///{work / 'tuner.db'}'}}\ntargets:\n{target}")
    return cfg


def tune(
    cfg: Path, work: Path, sampler: str, budget: int, flags: str, args: argparse.Namespace, servers: Servers
) -> dict:
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
        "--sampler",
        sampler,
        "--budget",
        str(budget),
        "--flags",
        flags,
        "--no-noise-check",
        "--run-seconds",
        str(args.run_seconds),
        "--max-runs",
        str(args.max_runs),
        "--max-time",
        "4h",
        "--seed",
        str(args.seed),
        "--json",
    ]
    if servers.backend == "llamacpp":  # vLLM's client and the tiny model's tokenizer (a vLLM target has both)
        argv += ["--client-python", servers.python, "--tokenizer", servers.model]
    t0 = time.monotonic()
    from tuner.apply.launch import die_with_parent_hook

    with open(work / f"{sampler}.log", "w") as log:
        # dies with this script (a stopped bench leaves no search, nor its trial servers, running)
        out = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=log, text=True, check=False, preexec_fn=die_with_parent_hook
        )
    if out.returncode != 0:
        sys.exit(f"{sampler}: tuner tune exited {out.returncode}; see {work / (sampler + '.log')}")
    result = json.loads(out.stdout)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    result["backend"] = servers.backend  # for bench/tune_corpus.py's table (whose defaults an empty config is)
    (work / f"{sampler}.json").write_text(json.dumps(result, indent=1))
    return result


def key(flags: dict) -> str:
    return json.dumps(flags, sort_keys=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="chat", help="a built-in workload")
    ap.add_argument(
        "--workload-file", help="a workload file `tuner workload` wrote from a store (instead of --workload)"
    )
    ap.add_argument("--name", help="its name in the output (default: the file's stem)")
    ap.add_argument("--slo", help=f"its SLO (default {FILE_SLO})")
    ap.add_argument(
        "--grid", help=f"the flags searched with their values (default {FILE_GRID}; llama-server {LLAMA_GRID})"
    )
    ap.add_argument(
        "--backend", choices=["vllm", "llamacpp"], default="vllm", help="the trial servers (default %(default)s)"
    )
    ap.add_argument("--in-force", help="the flags in force, as JSON (default {}: the server's defaults)")
    ap.add_argument("--run-seconds", type=float, default=12.0)
    ap.add_argument("--max-runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["grid", "tpe", "random"],
        help="a search not to run (its result in the workdir is read back where there is one); repeatable",
    )
    ap.add_argument("--workdir", help="default: a new temporary directory")
    args = ap.parse_args()
    if args.workload_file:
        args.workload = add_file_workload(args)
    elif args.backend != "vllm":
        sys.exit("--backend llamacpp takes a --workload-file (the built-in workloads search vLLM's flags)")
    servers = Servers.from_env(args.backend)
    work = Path(args.workdir or tempfile.mkdtemp(prefix=f"tune-bench-{args.workload}-"))
    work.mkdir(parents=True, exist_ok=True)
    cfg = write_config(work, args.workload, servers)
    subprocess.run(
        [sys.executable, "-m", "tuner.cli", "-c", str(cfg), "db", "upgrade"], check=True, stdout=subprocess.DEVNULL
    )
    flags = WORKLOADS[args.workload][2]
    print(
        f"workload {args.workload}: {WORKLOADS[args.workload][0]}; SLO {WORKLOADS[args.workload][1]}; "
        f"grid {flags}; workdir {work}; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    results = {}
    for sampler in ("grid", "tpe", "random"):
        if sampler in args.skip:  # its result from an earlier run in the workdir, if there is one
            if (work / f"{sampler}.json").exists():
                results[sampler] = json.loads((work / f"{sampler}.json").read_text())
            elif sampler == "grid":
                raise SystemExit(f"--skip grid: no grid.json in {work} to score against (run the grid first)")
            continue
        grid_n = sum(t["status"] != "pruned" for t in results["grid"]["trials"]) if "grid" in results else 0
        budget = 10_000 if sampler == "grid" else max(2, grid_n // 4)
        results[sampler] = tune(cfg, work, sampler, budget, flags, args, servers)
        print(f"{sampler}: {results[sampler]['counts']} in {results[sampler]['wall_s']:.0f}s", flush=True)
    grid = {key(t["flags"]): t for t in results["grid"]["trials"] if t["status"] == "measured"}
    best = max(t["capacity_rps"] for t in grid.values())
    print(
        f"\ngrid ({len(grid)} points measured, {results['grid']['counts']['pruned']} pruned, "
        f"{results['grid']['wall_s']:.0f}s):"
    )
    for t in sorted(grid.values(), key=lambda t: -t["capacity_rps"]):
        print(f"  {t['capacity_rps']:6.3g} req/s  {' '.join(f'{k}={v}' for k, v in t['flags'].items())}")
    print(f"\n{'search':8} {'trials':>8} {'crashes':>8} {'chosen/grid-best':>17} {'measured/grid-best':>19}  chosen")
    for sampler in [s for s in ("tpe", "random") if s in results]:
        r = results[sampler]
        chosen = r["best"]["flags"]
        in_grid = grid.get(key(chosen), {}).get("capacity_rps")
        trials = r["counts"]["measured"] + r["counts"]["crashed"]
        print(
            f"{sampler:8} {trials:>4}/{len(grid):<3} {r['counts']['crashed']:>8} "
            f"{(in_grid or 0) / best:>17.0%} {r['best']['capacity_rps'] / best:>19.0%}  "
            f"{' '.join(f'{k}={v}' for k, v in chosen.items())}"
        )
    spread = (best - min(t["capacity_rps"] for t in grid.values())) / best
    print(
        f"\ngrid best {best:.3g} req/s; worst is {spread:.0%} below it; baseline (the flags in force) "
        f"{results['tpe']['baseline']['capacity_rps'] if 'tpe' in results else '-'} req/s; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
