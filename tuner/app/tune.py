"""Tune: find the flags that serve the most traffic within the SLO, by measuring candidates on trial servers.

What it does, in order:
  1. reap: a trial server journaled ``running`` by a tuner that died is stopped, its trial marked interrupted;
  2. the workload (a file, or the stored window: tuner/signals/workload.py), the SLO (the target's), the flags in
     force (the baseline), the memory model's facts (the model's config.json; a GPU reading, or on a CPU host
     the KV space vLLM is given);
  3. where trials run: shadow mode, a second server on a spare port beside production, when the memory model
     says both fit (the host's available memory, or the GPU's free memory); otherwise it stops and says so,
     unless ``--on-target``: then, only inside one of the target's maintenance windows, production is drained and
     the trials run on its own port; that is journaled as an open apply of kind ``tune`` (the target's lock: no
     apply, auto step or supervised restart meanwhile), and production comes back with the flags in force at the
     end, or from the reconcile of the next tuner if this one dies;
  4. the search (tuner/tune/search.py): the baseline first, then the advisor's proposals, then optuna's TPE;
     every candidate passes the memory model and vLLM's start-up checks before it starts (tuner/tune/space.py);
  5. each trial: journaled, started, health-gated, its capacity bracketed with vLLM's benchmark client
     (tuner/tune/capacity.py, tuner/tune/bench.py), stopped; a crash is recorded with the server's error line;
  6. noise: the winner is started again and measured again; the spread of the two is the run's noise;
  7. the answer: a ranked table, and when the winner beats the baseline by more than the noise, a stored
     recommendation whose evidence is the measurement (apply it with `tuner apply-recommendation`).
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from tuner.advise.facts import load_model
from tuner.advise.recommend import diff_key, evaluate
from tuner.app.recommend import RecommendRequest, gather_inputs
from tuner.app.room import hardware, second_server, shadow_fits
from tuner.apply import managed as mg
from tuner.apply.flow import Applier, flags_in_force
from tuner.apply.launch import free_port
from tuner.config import Config, Target, parse_window, window_left
from tuner.errors import ApplyError, ConfigError, NothingToMeasureError, ServerStartError, TunerError
from tuner.signals.workload import Workload, dump_workload, from_window, parse_workload
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store import tuning as tj
from tuner.store.store import Store
from tuner.tune.bench import BenchClient, BenchError
from tuner.tune.capacity import find_capacity, rate_floor
from tuner.tune.search import Outcome, Point, point_key, search
from tuner.tune.space import (PRUNE_KINDS, Hardware, Verdict, axes_for, canonical, feasible, missing_from_argv,
                               not_applied, workload_flags)

__all__ = ["TuneRequest", "tune", "workload_of", "reap_orphans"]

@dataclass(frozen=True)
class TuneRequest:
    target: str
    workload_file: str | None = None
    window_s: float = 3600.0
    budget: int = 8  # trials that start a server, the noise re-run included
    max_time_s: float = 3600.0
    flags: tuple[str, ...] = ()  # flags to search (default: every searchable one the host has)
    resume: bool = False
    on_target: bool = False
    run_s: float = 15.0  # seconds of load per rate
    min_prompts: int = 30
    max_runs: int = 6  # rate runs per capacity search
    tolerance: float = 0.15  # bracket width at which a capacity search stops
    noise_check: bool = True
    seed: int = 0
    client_python: str | None = None  # a Python with vLLM: runs its benchmark client (default: the vLLM target's)
    tokenizer: str | None = None  # for the client's prompts (default: the vLLM target's model)
    sampler: str = "tpe"  # tpe | random (seeded with the baseline only) | grid (every feasible point)


@dataclass
class _Ctx:
    cfg: Config
    store: Store
    target: Target
    req: TuneRequest
    config_dir: Path
    say: Callable[[str], None]
    clock: Callable[[], float]
    run_id: int = 0
    workload: Workload | None = None
    best_rps: float = 0.0
    trial_no: int = 0
    waiting: list[str] = field(default_factory=list)  # what it waits for now (shared with the caller's progress)
    log_dir: Path = field(default_factory=Path)
    bench: Any = None  # the BenchClient of this run
    tokenizer: str = ""
    on_target: bool = False  # trials run on the target's own port (production drained)


def _flag_text(flags: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in flags.items()) or "(server defaults)"


def workload_of(cfg: Config, store: Store, target: str, *, window_s: float, path: str | None, now: float) -> Workload:
    """The workload to replay: the file when given, else the target's stored window (ConfigError naming what to
    pass when there is none)."""
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(path, "", f"cannot read the workload file: {exc.strerror or exc}") from None
        return parse_workload(text, path)
    t = cfg.target(target)
    if t.backend != "vllm":
        raise ConfigError("tuner tune", "--workload", f"{target} is {t.backend}: its metrics carry no request "
                                                      "lengths; pass a workload file")
    limit, source = _limit_in_force(store, t)
    w = (from_window(store.window(target, now - window_s, now), max_model_len=limit, limit_source=source)
         if target in store.target_names() else None)
    if w is None:
        raise ConfigError("tuner tune", "--workload", f"{target} finished no request in the last {window_s:g}s of "
                                                      "stored data; pass --workload FILE or a longer --window")
    return w


def _limit_in_force(store: Store, t: Target) -> tuple[int | None, str]:
    """The max-model-len the target serves with, and where that was read; (None, "") when unknown."""
    flags = flags_in_force(store.engine, t)
    if flags.get("max_model_len"):
        return int(flags["max_model_len"]), "the flags in force"
    if t.managed is not None and Path(t.managed.model).is_dir():
        try:
            return load_model(t.managed.model).max_position_embeddings, "vLLM's default: the model's context"
        except TunerError:
            return None, ""
    return None, ""


def reap_orphans(store: Store, say: Callable[[str], None], now: float) -> int:
    """Stop trial servers journaled running whose tuner is gone; mark their trials interrupted."""
    n = 0
    for t in tj.orphans(store.engine):
        note = "its tuner stopped before the trial finished"
        if t.pid is not None and mg.is_alive(t.pid, t.proc_start):
            how = mg.stop_server(mg.Running(t.pid, t.proc_start or 0, [], Path("/dev/null")), grace_s=5.0)
            note += f"; its server (pid {t.pid}) {how}"
            say(f"stopped the trial server left by an interrupted tune (pid {t.pid}): {how}")
            n += 1
        tj.finish_trial(store.engine, t.id, now=now, status="interrupted", capacity_rps=None,
                        detail={**t.detail, "note": note})
    return n


def _advisor_seeds(cfg: Config, store: Store, t: Target, current: dict[str, Any], window_s: float,
                   now: float) -> tuple[list[tuple[str, dict[str, Any]]], list[dict[str, Any]]]:
    """The advisor's one-step proposals, as starting points (none when it has nothing, or no data), and those that
    are no candidate of this target, each with why (a backend switch: tuner/tune/space.py ``not_applied``)."""
    seeds: list[tuple[str, dict[str, Any]]] = []
    refused: list[dict[str, Any]] = []
    try:
        inputs = gather_inputs(RecommendRequest(t.name, window_s), cfg, store, now)
    except Exception:  # the advisor's inputs are a head start, never a reason not to search
        return seeds, refused
    for inp in inputs:
        for r in evaluate(inp).emitted:
            why = not_applied(t.backend, dict(r.diff))
            if why:
                refused.append({"diff": dict(r.diff), "rules": list(r.rules), "why": why})
            else:
                seeds.append((f"advisor: {', '.join(r.rules)}", {**current, **dict(r.diff)}))
    return seeds, refused


def _grid(axes: tuple[Any, ...], fixed: dict[str, Any], limit: int = 50_000) -> Iterator[dict[str, Any]]:
    """Every point of the search space (the first ``limit``)."""
    import itertools
    for i, values in enumerate(itertools.product(*[a.values for a in axes])):
        if i >= limit:
            return
        yield canonical({**fixed, **dict(zip([a.name for a in axes], values))})


def _prune_groups(pruned: list[tuple[dict[str, Any], Verdict]], current: dict[str, Any]) -> list[dict[str, Any]]:
    """Pruned points counted by the check that refused them, largest first; each with one example reason (the flags
    in force's own, when they are among them) and what widens the search past it."""
    groups: dict[str, dict[str, Any]] = {}
    for flags, v in pruned:
        kind = v.kind or "other"
        g = groups.setdefault(kind, {"kind": kind, "count": 0, "reason": v.reason, "flags_in_force": False,
                                     "fix": PRUNE_KINDS.get(kind, "")})
        g["count"] += 1
        if point_key(flags) == point_key(current):
            g["flags_in_force"], g["reason"] = True, v.reason
    return sorted(groups.values(), key=lambda g: (not g["flags_in_force"], -g["count"]))


def _nothing_to_measure(groups: list[dict[str, Any]], total: int, workload: Workload) -> NothingToMeasureError:
    """The error for a space with no feasible point: its binding constraint (the one that refuses the flags in
    force, else the one that refuses most) and the fix, in one line."""
    g = groups[0]
    whose = ", the flags in force among them" if g["flags_in_force"] else ""
    fix = g["fix"]
    if g["kind"] == "len_below_longest":
        basis = (workload.inferred or {}).get("max_request_tokens")
        fix += f" (the workload's longest request is {workload.longest} tokens" + (
            f": {basis.note}" if basis is not None and basis.note else "") + ")"
    return NothingToMeasureError(f"all {total} candidates were pruned; binding constraint: {g['reason']} "
                                 f"({g['count']} of {total}{whose}); fix: {fix}")


def _trial(ctx: _Ctx, flags: dict[str, Any], label: str, hw: Hardware) -> Outcome:
    """Start one trial server with ``flags``, bracket its capacity, stop it; journaled throughout."""
    t, req = ctx.target, ctx.req
    assert t.managed is not None and ctx.workload is not None
    ctx.trial_no += 1
    shadow = t if ctx.on_target else t.model_copy(update={"url": f"http://127.0.0.1:{free_port()}"})
    port = shadow.url.rsplit(":", 1)[-1].split("/")[0]
    argv = mg.build_argv(shadow, flags)
    missing = missing_from_argv(t.backend, flags, argv)
    if missing:  # a trial is what it says or it does not run (feasible() refuses these first; this is the last word)
        ctx.trial_no -= 1
        ctx.say(f"  not started: its server would not run {', '.join(missing)}")
        return Outcome("pruned", 0.0, {"reason": f"the server's argv would not carry {', '.join(missing)}",
                                       "kind": "not_applied"})
    tid = tj.begin_trial(ctx.store.engine, ctx.run_id, now=ctx.clock(), flags=flags, seed=label, url=shadow.url)
    ctx.say(f"trial {ctx.trial_no}/{req.budget}{' (' + label + ')' if label else ''}: {_flag_text(flags)}")
    log = ctx.log_dir / f"{t.name}-tune-{ctx.run_id}-{tid}.log"
    ctx.waiting[:] = [f"trial {ctx.trial_no}: starting vLLM on :{port}"]
    server = mg.start_server(argv, mg.server_env(t), log, nice=t.managed.nice, die_with_parent=True)
    tj.trial_started(ctx.store.engine, tid, pid=server.pid, proc_start=server.start)
    started = ctx.clock()
    try:
        try:
            mg.wait_healthy(server, shadow.url, t.managed.start_timeout.total_seconds())
        except ServerStartError as exc:
            error = mg.error_line(log)
            detail: dict[str, Any] = {"error": str(exc), "server_error": error, "log": str(log)}
            tj.finish_trial(ctx.store.engine, tid, now=ctx.clock(), status="crashed", capacity_rps=0.0,
                            detail=detail)
            ctx.say(f"  crashed: {error or exc} (recorded; this region is avoided)")
            return Outcome("crashed", 0.0, detail)
        ctx.say(f"  healthy after {ctx.clock() - started:.0f}s; measuring capacity at the SLO")
        cap = _capacity(ctx, shadow.url, slots=flags.get("max_num_seqs" if t.backend == "vllm" else "parallel"))
    except BaseException as exc:
        mg.stop_server(server, grace_s=5.0)
        tj.finish_trial(ctx.store.engine, tid, now=ctx.clock(), status="interrupted", capacity_rps=None,
                        detail={"error": f"{type(exc).__name__}: {exc}"})
        raise
    ctx.waiting[:] = [f"trial {ctx.trial_no}: stopping the trial server"]
    mg.stop_server(server, grace_s=5.0)
    detail = {**cap, "log": str(log), "start_s": round(ctx.clock() - started, 1)}
    tj.finish_trial(ctx.store.engine, tid, now=ctx.clock(), status="measured", capacity_rps=cap["capacity_rps"],
                    detail=detail)
    ctx.best_rps = max(ctx.best_rps, cap["capacity_rps"])
    in_flight = cap.get("in_flight")
    there = f"; {in_flight:.1f} requests in flight at that rate" if isinstance(in_flight, (int, float)) else ""
    ctx.say(f"  capacity {cap['capacity_rps']:.3g} req/s within the SLO ({cap['note']}{there})")
    return Outcome("measured", cap["capacity_rps"], detail)


def _capacity(ctx: _Ctx, url: str, *, slots: int | None = None) -> dict[str, Any]:
    t, req, w = ctx.target, ctx.req, ctx.workload
    assert t.managed is not None and w is not None and t.slo is not None
    client = ctx.bench
    model, tokenizer = t.served_name, ctx.tokenizer

    def measure(rate: float) -> Any:
        prompts = max(req.min_prompts, int(rate * req.run_s))
        ctx.waiting[:] = [f"trial {ctx.trial_no}: {prompts} requests at {rate:.3g} req/s"]
        run = client.run(w, url=url, model=model, tokenizer=tokenizer, rate=rate, prompts=prompts, slo=t.slo)
        ctx.say(f"    {rate:7.3g} req/s: {run.good}/{run.sent} within the SLO ({run.attainment:.1%}), "
                f"P99 TTFT {run.ttft_p99 or 0:.2f}s, E2E {run.e2e_p99 or 0:.2f}s")
        return run
    start = ctx.best_rps or w.rate_rps or 1.0
    # A fresh server's first run is slower than the ones after it (measured here: 46/48 then 48/48 and 48/48 at the
    # same rate, twice, even after 16 concurrent warm-up requests): one run at the start rate warms it and is
    # discarded, as the bracket's runs' own two warm-up requests are.
    ctx.waiting[:] = [f"trial {ctx.trial_no}: warming the server up ({req.min_prompts} requests, not counted)"]
    warm = client.run(w, url=url, model=model, tokenizer=tokenizer, rate=start, prompts=req.min_prompts, slo=t.slo)
    cap = find_capacity(measure, t.slo.objective, start_rps=start, tolerance=req.tolerance, max_runs=req.max_runs,
                        floor_rps=rate_floor(req.min_prompts, req.run_s, w.rate_rps), slots=slots)
    return {**cap.as_json(), "warmup": warm.as_json()}


def _ranked(points: list[Point]) -> list[Point]:
    return sorted(points, key=lambda p: (p.outcome.status != "measured", -p.outcome.capacity_rps))


def _diff(current: dict[str, Any], best: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in best.items() if current.get(k) != v}


def _window_time(t: Target, now: float) -> float:
    """Seconds of the open maintenance window that trials on the target may use (the restart of production after
    them is kept inside it); ConfigError naming the key when no window is open."""
    key = f"targets[{t.name}].apply.maintenance_windows"
    windows = [parse_window(w) for w in t.apply.maintenance_windows]
    if not windows:
        raise ConfigError("config", key, "--on-target stops production for the trials: set the windows it may do "
                                         "that in, e.g. ['daily 02:00-04:00'] (UTC)")
    left = window_left(windows, now)
    assert t.managed is not None
    margin = t.managed.start_timeout.total_seconds() + t.managed.drain_timeout.total_seconds()
    if left <= margin:
        when = "no window is open now" if left == 0 else f"the open window closes in {left:.0f}s"
        listed = ", ".join(t.apply.maintenance_windows)
        raise ConfigError("config", key, f"--on-target runs only inside a maintenance window ({listed} UTC); {when}, "
                                         f"and production needs {margin:.0f}s (drain + start) to be back before it "
                                         "closes")
    return left - margin


@contextmanager
def _target_taken(ctx: _Ctx, current: dict[str, Any]) -> Iterator[None]:
    """On-target trials: production drained for the body and started again with ``current`` after it, all in one
    apply-journal entry of kind ``tune`` (the target's lock). Nothing to do in shadow mode."""
    if not ctx.on_target:
        yield
        return
    t, engine = ctx.target, ctx.store.engine
    ap = Applier(ctx.cfg, ctx.store, ctx.config_dir, say=ctx.say, clock=ctx.clock)
    argv = mg.build_argv(t, current)
    aid = jr.begin_apply(engine, target=t.name, recommendation_id=None, kind="tune", mode="manual", now=ctx.clock(),
                         diff={}, old_flags=current, new_flags=current, old_argv=argv, new_argv=argv,
                         owner_pid=ap.owner[0], owner_start=ap.owner[1])
    r = ap.running(t)
    ap._step(aid, "draining", f"tuning run {ctx.run_id} on the target: " + (f"pid {r.pid}" if r else
                                                                          "no server running"), state="draining")
    if r is not None:
        ctx.waiting[:] = [f"draining {t.name} for the trials"]
        ap._step(aid, "stopped", ap._drain(t, r))
    ap._save(t, None, current, "stopped", note=f"tuning run {ctx.run_id} on the target")
    ap._step(aid, "tuning", f"trials on {t.url}", state="tuning")
    failed: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        failed = exc
        raise
    finally:
        ctx.waiting[:] = [f"starting {t.name} again with the flags in force"]
        ap._step(aid, "restoring", json.dumps(argv), state="starting")
        try:
            ap.launch(t, current)
        except ServerStartError as exc:
            first = str(exc).splitlines()[0]
            ap._step(aid, "restore_failed", first)
            jr.finish(engine, aid, "failed", f"tuned on the target; starting it again with the flags in force "
                                             f"FAILED: {first}", now=ctx.clock())
            if failed is None:
                raise ApplyError(f"{t.name}: trials done, but it did not start again with the flags in force: "
                                 f"{first}; `tuner managed start {t.name}` once the cause is fixed") from None
        else:
            ap._step(aid, "restored", "the flags in force, healthy")
            how = "stopped early: " + type(failed).__name__ if failed is not None else "trials done"
            jr.finish(engine, aid, "rolled_back", f"tuning run {ctx.run_id} on the target ({how}); the flags in "
                                                  "force restored and healthy", now=ctx.clock())


def tune(cfg: Config, store: Store, req: TuneRequest, *, config_dir: Path, say: Callable[[str], None] = print,
         clock: Callable[[], float] = time.time, waiting: list[str] | None = None) -> dict[str, Any]:
    """Run a tuning session; the result as `tuner tune --json` prints it (docs/tune.md)."""
    now = clock()
    reap_orphans(store, say, now)
    t = cfg.target(req.target)
    where = f"targets[{t.name}]"
    if t.managed is None:
        raise ConfigError("config", f"{where}.managed", "tuner tune starts trial servers from the target's managed "
                                                        "section (model, executable): add one")
    if t.slo is None:
        raise ConfigError("config", f"{where}.slo", "tuner tune measures capacity within the SLO: set ttft_p99 "
                                                    "and/or e2e_p99 (and objective)")
    if req.sampler not in ("tpe", "random", "grid"):
        raise ConfigError("tuner tune", "--sampler", f"{req.sampler!r}: expected tpe, random or grid")
    if req.budget < 1:
        raise ConfigError("tuner tune", "--budget", f"expected at least 1 trial, got {req.budget}")
    max_time_s = req.max_time_s
    if req.on_target:
        max_time_s = min(max_time_s, _window_time(t, now))
        # an on-target tune (or apply) whose tuner died left production down or changed: put it back first
        for line in Applier(cfg, store, config_dir, say=say, clock=clock,
                            room=lambda t, f: second_server(store, t, f, clock())).reconcile():
            say(line)
    llama = t.backend != "vllm"
    client_python = req.client_python or (None if llama else t.managed.executable or "python3")
    if client_python is None:
        raise ConfigError("tuner tune", "--client-python", "llama-server is loaded with vLLM's benchmark client too "
                                                           "(the same client for both servers): give a Python that "
                                                           "has vllm installed")
    tokenizer = req.tokenizer or (None if llama else t.managed.model)
    if tokenizer is None:
        raise ConfigError("tuner tune", "--tokenizer", "the benchmark client writes its prompts with a Hugging Face "
                                                       "tokenizer: give a model directory or hub name whose "
                                                       "tokenizer matches the GGUF's")
    previous = tj.latest_run(store.engine, t.name) if req.resume else None
    if req.resume and previous is None:
        raise ConfigError("tuner tune", "--resume", f"no earlier tuning run of {t.name} to resume")
    workload = (Workload.model_validate(previous.workload) if previous is not None else
                workload_of(cfg, store, t.name, window_s=req.window_s, path=req.workload_file, now=now))
    model = load_model(t.managed.model) if Path(t.managed.model).exists() else None
    hw, hw_json = hardware(store, t, now)
    if req.on_target:
        fits, why = True, f"trials on {t.name} itself (--on-target), production drained until the end"
    else:
        fits, why = shadow_fits(t, hw, hw_json, model)
    if not fits:
        raise ConfigError("tuner tune", "--on-target", f"no room for a trial server beside {t.name}: {why}")
    in_force = flags_in_force(store.engine, t)  # as production runs them (its argv's order: restored as is)
    current = canonical(in_force)
    axes = axes_for(t.backend, current, longest=workload.longest,
                    model_max_len=model.max_position_embeddings if model else None, on_gpu=hw_json["kind"] == "gpu",
                    names=req.flags or None)
    fixed = {k: v for k, v in current.items() if k not in {a.name for a in axes}}

    def check(flags: dict[str, Any]) -> Verdict:
        return feasible(t.backend, flags, model=model, hardware=hw, longest=workload.longest)

    slo_json = {k: (v.total_seconds() if hasattr(v, "total_seconds") else v)
                for k, v in t.slo.model_dump().items() if v is not None}
    request_json = {"budget": req.budget, "max_time_s": max_time_s, "flags": [a.name for a in axes],
                    "sampler": req.sampler, "where": "on_target" if req.on_target else "shadow", "hardware": hw_json,
                    "shadow_fit": why}
    seeds = [("baseline", current)]
    not_candidates: list[dict[str, Any]] = []
    if req.sampler == "tpe":
        advised, not_candidates = _advisor_seeds(cfg, store, t, current, req.window_s, now)
        seeds += advised
        for nc in not_candidates:
            say(f"the advisor's {_flag_text(nc['diff'])} ({', '.join(nc['rules'])}): {nc['why']}")
    elif req.sampler == "grid":
        seeds = []
    # Nothing to measure is an error, found before anything starts: every point of the space and every seed refused.
    space = [*list(_grid(axes, fixed)), *[canonical({**fixed, **f}) for _, f in seeds]]
    verdicts = [(f, check(f)) for f in space]
    if not any(v.ok for _, v in verdicts):
        unique = {point_key(f): (f, v) for f, v in verdicts}
        groups = _prune_groups(list(unique.values()), current)
        for g in groups:
            say(f"pruned {g['count']:>5} x {g['kind']}: {g['reason']}")
        raise _nothing_to_measure(groups, len(unique), workload)
    history: list[Point] = []
    if previous is not None:
        run_id = previous.id
        for tr in tj.trials(store.engine, run_id):
            if tr.status in ("measured", "crashed", "pruned"):
                history.append(Point(tr.flags, Outcome(tr.status, tr.capacity_rps or 0.0, tr.detail), tr.seed))
        say(f"resuming tuning run {run_id} of {t.name}: {len(history)} trials done")
    else:
        run_id = tj.begin_run(store.engine, target=t.name, now=now, request=request_json,
                              workload=dump_workload(workload), slo=slo_json, baseline_flags=current)
    ctx = _Ctx(cfg, store, t, req, config_dir, say, clock, run_id=run_id, workload=workload,
               waiting=waiting if waiting is not None else [], log_dir=(config_dir / t.managed.log_dir).resolve(),
               on_target=req.on_target)
    ctx.trial_no = sum(1 for p in history if p.outcome.status != "pruned")
    ctx.best_rps = max((p.outcome.capacity_rps for p in history), default=0.0)
    say(f"tuning {t.name}: workload {workload.input_len} in / {workload.output_len} out tokens "
        f"(range {workload.range_ratio:g}, prefix {workload.prefix_len}), burstiness {workload.burstiness:g}, "
        f"from {workload.source}; SLO {slo_json}; {why}")
    say(f"searching {', '.join(a.name for a in axes)} around {_flag_text(current)}; budget {req.budget} trials, "
        f"{max_time_s:g}s")
    noise_budget = 1 if req.noise_check and req.budget >= 3 else 0
    carry = workload_flags(axes, workload)
    if carry and req.sampler == "tpe":
        say(f"the workload argues for {_flag_text(carry)}: the search's steps along "
            f"{'max-num-seqs' if t.backend == 'vllm' else '--parallel'} set it")
    try:
        with BenchClient(client_python, ctx.log_dir / f"tune-{run_id}") as client, _target_taken(ctx, in_force):
            ctx.bench, ctx.tokenizer = client, tokenizer

            def measure(flags: dict[str, Any], label: str) -> Outcome:
                try:
                    return _trial(ctx, flags, label, hw)
                except BenchError as exc:
                    return Outcome("crashed", 0.0, {"error": str(exc)})

            def pruned(flags: dict[str, Any], v: Verdict) -> None:
                tj.begin_trial(store.engine, run_id, now=clock(), flags=flags, seed="", url="", status="pruned",
                               capacity_rps=0.0, detail={"reason": v.reason, "kind": v.kind,
                                                         "memory": dict(v.memory)})

            points = list(history) + search(
                axes, fixed, measure=measure, feasible=check, seeds=seeds, budget=req.budget - noise_budget,
                max_time_s=max_time_s - (clock() - now), clock=clock, history=history, on_pruned=pruned,
                seed=req.seed, sampler=req.sampler, gallop="max_num_seqs" if t.backend == "vllm" else "parallel",
                carry=carry)
            measured = [p for p in points if p.outcome.status == "measured"]
            noise = None
            best = _ranked(measured)[0] if measured else None
            if best is not None and noise_budget and best.outcome.capacity_rps > 0:
                say("noise: the winner again, on a fresh server")
                again = measure(dict(best.flags), "noise")
                if again.status == "measured":
                    a, b = best.outcome.capacity_rps, again.capacity_rps
                    noise = {"first_rps": a, "second_rps": b, "spread": round(abs(a - b) / max(a, b), 4)}
    except BaseException as exc:
        tj.finish_run(store.engine, run_id, now=clock(), state="failed", result={},
                      note=f"stopped: {type(exc).__name__}: {exc}")
        raise
    result = _result(ctx, points, current, workload, slo_json, noise, axes=[a.name for a in axes])
    result["not_candidates"] = not_candidates
    if not result["counts"]["measured"] and not result["counts"]["crashed"] and result["counts"]["pruned"]:
        pruned = [(dict(p.flags), Verdict(False, p.outcome.detail.get("reason", ""), {},
                                          p.outcome.detail.get("kind", ""))) for p in points]
        groups = _prune_groups(pruned, current)
        tj.finish_run(store.engine, run_id, now=clock(), state="failed", result=result,
                      note="every candidate visited was pruned")
        raise _nothing_to_measure(groups, len(pruned), workload)
    rec_id = _recommend(ctx, result, current)
    result["recommendation_id"] = rec_id
    tj.finish_run(store.engine, run_id, now=clock(), state="done", result=result)
    return result


def _trial_json(p: Point) -> dict[str, Any]:
    d = p.outcome.detail
    return {"flags": dict(p.flags), "capacity_rps": p.outcome.capacity_rps if p.outcome.status == "measured" else None,
            "ttft_p99": d.get("ttft_p99"), "e2e_p99": d.get("e2e_p99"), "status": p.outcome.status,
            "seed": p.seed, "note": d.get("note") or d.get("reason") or d.get("server_error") or d.get("error") or "",
            "memory": d.get("memory") or {}}


def _result(ctx: _Ctx, points: list[Point], current: dict[str, Any], workload: Workload, slo: dict[str, Any],
            noise: dict[str, Any] | None, *, axes: list[str]) -> dict[str, Any]:
    measured = [p for p in points if p.outcome.status == "measured"]
    base = next((p for p in measured if point_key(p.flags) == point_key(current)), None)
    best = _ranked(measured)[0] if measured else None
    return {
        "target": ctx.target.name, "run_id": ctx.run_id, "workload": dump_workload(workload), "slo": slo,
        "searched": axes, "trials": [_trial_json(p) for p in _ranked(points) if p.outcome.status != "pruned"],
        "pruned": _prune_groups([(dict(p.flags), Verdict(False, p.outcome.detail.get("reason", ""), {},
                                                         p.outcome.detail.get("kind", "")))
                                 for p in points if p.outcome.status == "pruned"], current),
        "best": {"flags": dict(best.flags), "capacity_rps": best.outcome.capacity_rps,
                 "ttft_p99": best.outcome.detail.get("ttft_p99"),
                 "e2e_p99": best.outcome.detail.get("e2e_p99")} if best else None,
        "baseline": {"flags": dict(current), "capacity_rps": base.outcome.capacity_rps if base else None},
        "noise": noise,
        "counts": {"measured": len(measured), "crashed": sum(p.outcome.status == "crashed" for p in points),
                   "pruned": sum(p.outcome.status == "pruned" for p in points)},
    }


def _recommend(ctx: _Ctx, result: dict[str, Any], current: dict[str, Any]) -> int | None:
    """Store the winner as a recommendation when it beats the baseline by more than the noise."""
    best, base = result["best"], result["baseline"]
    if not best or base["capacity_rps"] is None:
        return None
    diff = _diff(current, best["flags"])
    spread = (result["noise"] or {}).get("spread") or 0.0
    margin = max(ctx.req.tolerance, spread)
    gain = best["capacity_rps"] / base["capacity_rps"] - 1 if base["capacity_rps"] else float("inf")
    if not diff or gain <= margin:
        result["verdict"] = (f"keep the flags in force: the best candidate is {gain:+.0%} against them, within the "
                             f"measurement's margin ({margin:.0%})" if diff else "the flags in force are the best found")
        return None
    result["verdict"] = (f"{_flag_text(diff)}: capacity {base['capacity_rps']:.3g} -> {best['capacity_rps']:.3g} req/s "
                         f"within the SLO ({gain:+.0%}, margin {margin:.0%})")
    winner = next(tr for tr in result["trials"] if tr["flags"] == best["flags"])
    evidence = [{"rule": "tune", "run_id": ctx.run_id, "capacity_rps": best["capacity_rps"],
                 "baseline_capacity_rps": base["capacity_rps"], "gain": round(gain, 4), "margin": margin,
                 "ttft_p99": best["ttft_p99"], "e2e_p99": best["e2e_p99"], "noise": result["noise"],
                 "trials": result["counts"], "workload": result["workload"], "slo": result["slo"]}]
    same = next((r for r in recs.proposed_for(ctx.store.engine, ctx.target.name) if r.diff_key == diff_key(diff)),
                None)
    if same is not None:  # the advisor proposed this very change: it now carries the measurement too
        recs.renew_recommendation(
            ctx.store.engine, same.id, now=ctx.clock(), rules=list(dict.fromkeys([*same.rules, "tune"])),
            evidence=[e for e in same.evidence if e.get("rule") != "tune"] + evidence,
            confidence=max(same.confidence, 0.9), memory_check=same.memory_check,
            current={**same.current, **{k: current.get(k) for k in diff}})
        return same.id
    return recs.add_recommendation(
        ctx.store.engine, target=ctx.target.name, now=ctx.clock(), rules=["tune"], diff_key=diff_key(diff),
        diff=diff, current={k: current.get(k) for k in diff}, evidence=evidence,
        expected_effect=f"capacity within the SLO {base['capacity_rps']:.3g} -> {best['capacity_rps']:.3g} req/s "
                        "(measured on a trial server with the workload replayed)",
        risk=("measured on the target itself in its maintenance window" if ctx.on_target else
              "measured on a shadow server beside production") + "; the live verdict judges it again after the apply",
        confidence=0.9, rank=1,
        memory_check={"ok": True, "reason": "passed the memory model before its trial started",
                      "before": {}, "after": winner.get("memory") or {}})
