"""A run-off: what `tuner tune` told the user to run against the grid's best, on fresh servers, in turns.

bench/tune_corpus.py scores a search by the grid's one reading of the config tune chose against the highest of the
grid's twelve readings, each taken on its own fresh server minutes apart. The same flags read a rung or two of the
rate ladder apart from server to server here (bench/results/*-tune-spread.md), so a choice one rung (87%) below the
grid's best may serve as much, and the grid's best is partly the luck of its highest reading. The run-off measures
the two again the way `tuner tune` itself settles a ranking: each on a fresh server with its capacity bracketed,
then both run in turns at one rate (A B, B A, ...) until Fisher's exact test decides or the pairs are spent
(`_compare` in tuner/app/tune.py, the test in tuner/tune/compare.py). It is reported beside the registered score,
never instead of it: the held-back bar stays ">= 95% of the grid's best reading".

For each bench/tune.py workdir given (<shape>.<start> with grid.json and tpe.json, as bench/tune_corpus.py --score
reads them), one `tuner tune --sampler random --budget 3` in <workdir>/runoff: the flags in force are one side (vLLM's
defaults where either side is them, since a grid axis cannot say "unset"; else the grid's best), `--flags` gives the
other side's values, and the budget is those two trials and the comparison. tune's space holds the flags in force as
well, so where the sides differ in two flags it is 2 x 2: the sampler's `--seed` is chosen (by tune's own search, run
with nothing measured) so that its one trial is the other side, and a run-off whose trial was anything else is void,
left out of the tally. A run whose decision is the grid's best has nothing to run off and is skipped, and so
(without --all) is one the registered scorer puts at 95% or above.

  python bench/runoff.py /tmp/tc6/drawn-3779-2.poor /tmp/tc6/drawn-3779-2.defaults
  python bench/runoff.py --pairs 6 /tmp/tc6/drawn-3779-1.defaults     # more turns before "no difference measurable"
  python bench/runoff.py --table /tmp/tc6 /tmp/tc7                   # the table of the run-offs already run
  python bench/runoff.py --choice /tmp/tc8/drawn-6446-1.poor          # tune's choice (the registered score's subject)
Needs TUNER_VLLM_PYTHON and TUNER_TINY_MODEL (scripts/setup-real-servers.sh prints them). ~12 min a run-off here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.tune import FILE_SLO, WORKLOADS, Servers, key, write_config  # noqa: E402
from bench.tune_corpus import _flags, score_run  # noqa: E402

FIXED = "max_model_len"  # every trial of the corpus has it (bench/tune.py), so neither side differs by it


def _unfixed(flags: dict) -> dict:
    """``flags`` without the one every trial of the corpus carries."""
    return {k: v for k, v in flags.items() if k != FIXED}


def sides(work: Path, subject: str = "decision") -> dict | None:
    """The two configs of ``work``'s run-off, or None when there is nothing to run off (tune's decision is the grid's
    best). ``in_force`` is the side run as the flags in force, ``searched`` the other (a grid axis cannot say "unset",
    so vLLM's defaults are always the flags in force). ``subject`` "choice": tune's choice (the best it measured, what
    the registered score scores) in place of its decision, under the same keys."""
    s = score_run(work)
    if s["backend"] != "vllm":
        raise SystemExit(f"{work}: a {s['backend']} run; the run-off runs vLLM's")
    pick = "tpe_decision" if subject == "decision" else "tpe"
    best, decided = _unfixed(s["grid_best_flags"]), _unfixed(s[f"{pick}_flags"] or {})
    if key(best) == key(decided):
        return None
    in_force, searched = (decided, best) if not decided else (best, decided)
    return {
        "grid_best": best,
        "decision": decided,
        "subject": subject,
        "score": s[pick],  # the registered score of the decision (or choice): the grid's reading / the grid's best
        "grid_best_rps": s["grid_best"],
        "in_force": in_force,
        "searched": searched,
    }


def grid_of(flags: dict) -> str:
    """``--flags`` for a search space of ``flags`` alone."""
    return ",".join(f"{k}={json.dumps(v) if isinstance(v, bool) else v}" for k, v in sorted(flags.items()))


_DIRS = {"decision": "runoff", "choice": "runoff-choice"}  # where each subject's run-off is kept, in a run's workdir


def sampler_seed(two: dict, tries: int = 500) -> int:
    """A ``--seed`` for which `tuner tune --sampler random` measures the searched side as its one trial.

    tune's space always holds the flags in force as well: where the two sides differ in two flags the space is 2 x 2,
    and a random pick may be a point that is neither (drawn-6446-1 from one sequence ran off 8/256 against 8/2048, not
    1/256). The sampler is seeded, so its pick is known before any server starts: this runs tune's own search with
    nothing measured, as tune builds it (the flags in force as the baseline, then the sampler)."""
    from tuner.store.tuning import TrialStatus
    from tuner.tune.search import Outcome, search
    from tuner.tune.space import Verdict, canonical, vllm_axes

    in_force = canonical({FIXED: 1024, **two["in_force"]})
    axes = vllm_axes(in_force, longest=1, model_max_len=1024, on_gpu=False, names=grid_of(two["searched"]).split(","))
    fixed = {k: v for k, v in in_force.items() if k not in {a.name for a in axes}}
    want = key({FIXED: 1024, **two["searched"]})
    for seed in range(tries):
        got = search(
            axes,
            fixed,
            measure=lambda flags, label: Outcome(TrialStatus.MEASURED, 1.0, {}),
            feasible=lambda flags: Verdict(True, "", {}),
            seeds=[("baseline", in_force)],
            budget=2,  # the run-off's budget of 3, less the comparison
            max_time_s=1e9,
            clock=lambda: 0.0,
            seed=seed,
            sampler="random",
        )
        if len(got) == 2 and key(got[1].flags) == want:
            return seed
    raise SystemExit(f"no sampler seed below {tries} picks {two['searched']} beside {two['in_force']}")


def measured_searched(r: dict) -> bool:
    """Whether the run-off's one trial besides the flags in force was the searched side (a run where it was not
    compared something else, and counts for nothing)."""
    others = [key(_unfixed(t["flags"])) for t in r["tune"].get("trials", [])]
    return [k for k in others if k != key(r["in_force"])] == [key(r["searched"])]


def run_off(work: Path, two: dict, pairs: int, args: argparse.Namespace, servers: Servers) -> dict:
    """``two`` (``sides(work)``) measured again: `tuner tune` in <work>/runoff, its result kept there as runoff.json."""
    out = work / _DIRS[two.get("subject", "decision")]
    out.mkdir(exist_ok=True)
    name = f"runoff-{work.name}"
    WORKLOADS[name] = (work / "workload.yaml", args.slo or FILE_SLO, grid_of(two["searched"]), two["in_force"])
    cfg = write_config(out, name, servers)
    subprocess.run(
        [sys.executable, "-m", "tuner.cli", "-c", str(cfg), "db", "upgrade"], check=True, stdout=subprocess.DEVNULL
    )
    argv = [
        sys.executable, "-m", "tuner.cli", "-c", str(cfg), "tune", "tiny",
        "--workload", str(out / "workload.yaml"),
        "--sampler", "random", "--seed", str(sampler_seed(two)), "--budget", "3", "--flags", grid_of(two["searched"]),
        "--compare-pairs", str(pairs),
        "--run-seconds", str(args.run_seconds), "--max-runs", str(args.max_runs),
        "--max-time", "2h", "--json",
    ]  # fmt: skip
    t0 = time.monotonic()
    with open(out / "tune.log", "w") as log:
        got = subprocess.run(argv, stdout=subprocess.PIPE, stderr=log, text=True, check=False)
    if got.returncode != 0:
        raise SystemExit(f"{work}: tuner tune exited {got.returncode}; see {out / 'tune.log'}")
    result = {**two, "tune": json.loads(got.stdout), "wall_s": round(time.monotonic() - t0, 1)}
    (out / "runoff.json").write_text(json.dumps(result, indent=1))
    return result


VOID = "void: tune measured another config"


def verdict(r: dict) -> str:
    """Which of the two served more within the SLO side by side, in the terms of the scorer (the grid's best or
    tune's decision), from the comparison's outcome (A: the flags in force, B: the searched side)."""
    if not measured_searched(r):
        return VOID
    c = r["tune"].get("comparison") or {}
    outcome = c.get("outcome")
    said = {None: "not compared", "same": "the same", "undecided": "no difference measurable"}
    if outcome in said:
        return said[outcome]
    winner = r["in_force"] if outcome == "a_better" else r["searched"]
    return "the grid's best" if key(winner) == key(r["grid_best"]) else "tune's decision"


def _counts(r: dict) -> str:
    """Each side's requests within the SLO at the comparison's last rate, pooled over its turns."""
    c = r["tune"].get("comparison") or {}
    rate = c.get("rate_rps")
    runs = c.get("runs") or {}
    said = []
    for side, flags in (("A", r["in_force"]), ("B", _unfixed(c.get("flags") or r["searched"]))):  # B: as measured
        at = [x for x in runs.get(side, []) if x.get("rate_rps") == rate]
        who = {key(r["grid_best"]): "grid's best", key(r["decision"]): "decision"}.get(key(flags)) or _flags(flags)
        said.append(f"{who} {sum(x['good'] for x in at)}/{sum(x['sent'] for x in at)}")
    return f"at {rate:.3g} req/s: " + ", ".join(said) if rate else "-"


def _capacity(r: dict, flags: dict) -> str:
    for t in r["tune"]["trials"]:
        if t["status"] == "measured" and key(_unfixed(t["flags"])) == key(flags):
            lo, hi = t.get("interval") or [None, None]
            return f"{t['capacity_rps']:.3g}" + (f" ({lo:.3g}-{hi:.3g})" if lo and hi else "")
    return "-"


def _worded(text: str, results: list[tuple[Path, dict]]) -> str:
    """``text`` in the run-offs' subject: "choice" for the word "decision" where they ran off tune's choice."""
    return text.replace("decision", "choice") if results and results[0][1].get("subject") == "choice" else text


def table(results: list[tuple[Path, dict]]) -> str:
    out = [
        "| run | tune's decision | its registered score | the grid's best (its grid reading) | fresh capacities: "
        "decision, grid's best | in turns | side by side, more within the SLO | minutes |",
        "|---|---|---:|---|---|---|---|---:|",
    ]
    for work, r in results:
        c = r["tune"].get("comparison") or {}
        out.append(
            f"| {work.name} | {_flags(r['decision'])} | {r['score']:.0%} | {_flags(r['grid_best'])} "
            f"({r['grid_best_rps']:.3g}) | {_capacity(r, r['decision'])}, {_capacity(r, r['grid_best'])} | "
            f"{c.get('pairs', 0)} pairs, {_counts(r)} | {verdict(r)} | {r['wall_s'] / 60:.1f} |"
        )
    return _worded("\n".join(out), results)


def tally(results: list[tuple[Path, dict]]) -> str:
    """One line over the run-offs, in the words bench/summary.py reads into the corpus's summary row."""
    said = [v for _, r in results if (v := verdict(r)) != VOID]  # a void run-off compared something else
    more, same, less = (said.count(v) for v in ("tune's decision", "the same", "the grid's best"))
    rest = len(said) - more - same - less  # no difference measurable, or not compared
    line = (
        f"Run off side by side on fresh servers ({len(said)} runs): tune's decision served more within the SLO than "
        f"the grid's best in {more}, as much in {same}, less in {less}, and no difference was measurable in {rest}."
    )
    return _worded(line, results)  # bench/summary.py reads the decision's line only


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="bench/tune.py workdirs (<shape>.<start>)")
    ap.add_argument("--pairs", type=int, default=4, help="turns of the two before 'no difference' (default 4)")
    ap.add_argument("--slo", help=f"the SLO (default {FILE_SLO}, the corpus's)")
    ap.add_argument("--run-seconds", type=float, default=12.0)
    ap.add_argument("--max-runs", type=int, default=5)
    ap.add_argument(
        "--all", action="store_true", help="also run off decisions scored at 95%% of the grid's best or above"
    )
    ap.add_argument(
        "--table", action="store_true", help="run nothing: the table of the run-offs under the folders given"
    )
    ap.add_argument(
        "--choice",
        action="store_true",
        help="run off tune's choice (the best it measured, which the registered score scores) in place of its "
        "decision; kept in <workdir>/runoff-choice",
    )
    args = ap.parse_args()
    subject = "choice" if args.choice else "decision"
    where = _DIRS[subject]
    if args.table:
        found = sorted(p.parent.parent for d in args.runs for p in d.glob(f"*/{where}/runoff.json"))
        results = [(w, json.loads((w / where / "runoff.json").read_text())) for w in found]
        print(table(results) + "\n\n" + tally(results))
        return 0
    servers = Servers.from_env("vllm")
    done = []
    for work in args.runs:
        print(f"{work.name}: {time.strftime('%H:%M:%S')} load average {os.getloadavg()[0]:.2f}", flush=True)
        two = sides(work, subject)
        if two is None:
            print(f"{work.name}: tune's {subject} is the grid's best; nothing to run off", flush=True)
            continue
        if two["score"] is not None and two["score"] >= 0.95 and not args.all:
            print(f"{work.name}: tune's {subject} scored {two['score']:.0%}; nothing to settle (--all runs it)")
            continue
        r = run_off(work, two, args.pairs, args, servers)
        done.append((work, r))
        print(table([(work, r)]).splitlines()[-1], flush=True)
    if done:
        print("\n" + table(done) + "\n\n" + tally(done))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
