"""Tune: find the flags that serve the most traffic within the SLO, by measuring candidates on trial servers.

What it does, in order:
  1. reap: a trial server journaled ``running`` by a tuner that died is stopped, its trial marked interrupted (a
     trial of a tune still at work, in another process, is left alone: each run records its tuner);
  2. the workload (a file, or the stored window: tuner/signals/workload.py), the SLO (the target's), the flags in
     force (the baseline), the memory model's facts (the model's config.json; a GPU reading, or on a CPU host
     the KV space vLLM is given);
  3. where trials run: shadow mode, a second server on a spare port beside production, when the memory model
     says both fit (the host's available memory, or the GPU's free memory); otherwise it stops and says so,
     unless ``--on-target``: then, only inside one of the target's maintenance windows, production is drained and
     the trials run on its own port; production comes back with the flags in force at the end, or from the
     reconcile of the next tuner if this one dies. Either way the run holds the target (and its replica group) in
     the apply journal, as an open entry of kind ``tune``: no apply, canary, rollback, auto step or second tune of
     it starts meanwhile, and the tune is refused while one of those holds it (TargetBusyError naming it). Trials
     beside production load the host an apply's verdict reads and take the room a restart or a spare needs; an
     apply changes the flags the tune measures against. In shadow mode (mode ``shadow``) production stays
     supervised; on the target (``--on-target``) the supervisor leaves it down, as for an apply;
  4. the search (tuner/tune/search.py): the baseline first, then the advisor's proposals (a backend switch is no
     candidate: said, never run), then optuna's TPE; every candidate passes the memory model and vLLM's start-up
     checks before it starts (tuner/tune/space.py), and a space where none passes is an error naming the binding
     constraint (NothingToMeasureError) before anything starts;
  5. each trial: journaled, started (a vLLM CPU worker on cores no other process is pinned to, the client on the
     others: tuner/tune/cores.py), its argv checked to carry every candidate flag, health-gated, its capacity
     bracketed with vLLM's benchmark client in runs sized from the objective (tuner/tune/capacity.py,
     tuner/tune/bench.py), stopped; a crash is recorded with the server's error line;
  6. the comparison: the best other config measured (the winner, or the runner-up when the flags in force measured
     highest) and the flags in force on fresh servers, run in turns at one rate until Fisher's exact test decides
     or the pairs are spent (tuner/tune/compare.py);
  7. the answer: a ranked table with each capacity's interval, and when the comparison confirms the other config
     (or, without one, the winner met a rate the flags in force missed), a stored recommendation whose evidence is
     the measurement (apply it with `tuner apply-recommendation`).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.advise.facts import ModelFacts, load_model
from tuner.advise.memory import vllm_batch_defaults
from tuner.advise.recommend import diff_key, evaluate
from tuner.app.recommend import engine_inputs
from tuner.app.room import hardware, second_server, shadow_fits
from tuner.apply import managed as mg
from tuner.apply.flow import Applier
from tuner.apply.launch import free_port
from tuner.apply.servers import flags_in_force
from tuner.backends import backend as backend_of
from tuner.collect import llamacpp
from tuner.config import Config, Target, parse_window, window_left
from tuner.errors import ApplyError, ConfigError, InputFileError, NothingToMeasureError, ServerStartError, TunerError
from tuner.files import read_text
from tuner.signals.workload import Workload, dump_workload, from_window, parse_workload
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store import tuning as tj
from tuner.store.journal import ApplyOutcome, ApplyState, ApplyStep, ServerState
from tuner.store.store import Store
from tuner.store.tuning import RunState, TrialStatus
from tuner.tune.bench import BenchClient, BenchError
from tuner.tune.capacity import find_capacity, rate_floor
from tuner.tune.compare import Decision, TurnRate, burst_factor, decide, design_effect, min_requests
from tuner.tune.cores import Placement, place, read_pinned
from tuner.tune.search import Outcome, Point, point_key, search
from tuner.tune.space import (
    PRUNE_KINDS,
    Hardware,
    Verdict,
    axes_for,
    canonical,
    feasible,
    missing_from_argv,
    not_applied,
    step_budget,
    workload_flags,
)

__all__ = ["TuneRequest", "tune", "workload_of", "reap_orphans"]

_PROPS_TIMEOUT_S = 3.0  # a trial server that answered its health check answers /props at once


@dataclass(frozen=True)
class TuneRequest:
    target: str
    workload_file: str | None = None
    window_s: float = 3600.0
    budget: int = 8  # trials that start a server, the comparison in turns counted as one
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
    cpu_bind: str = "spread"  # spread: the trial worker and the client on cores of their own; vllm: vLLM's own
    compare_pairs: int = 4  # turns of the best other config against the flags in force (A B, B A, ...) at most


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
    applier: Any = None  # the Applier holding the target for this run
    hold: int = 0  # the apply-journal entry (kind tune) holding the target
    cpu_host: bool = True  # vLLM runs on the CPU here (its worker's cores are placed, tuner/tune/cores.py)


def _flag_text(flags: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in flags.items()) or "(server defaults)"


class _Model:
    """The managed model's facts (config.json, the weights' size), read at most once: tune's set-up hands the same
    to the workload's limit, the memory model and the advisor's seeds. None when the path is not there; a model
    that cannot be read raises its ModelFactsError each time it is asked for, from the one reading."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._read: tuple[ModelFacts | None, TunerError | None] | None = None

    def __call__(self) -> ModelFacts | None:
        if self._read is None:
            try:
                self._read = (load_model(self.path) if Path(self.path).exists() else None, None)
            except TunerError as exc:
                self._read = (None, exc)
        model, error = self._read
        if error is not None:
            raise error
        return model


def workload_of(
    cfg: Config,
    store: Store,
    target: str,
    *,
    window_s: float,
    path: str | None,
    now: float,
    in_force: Mapping[str, Any] | None = None,
    model: Callable[[], ModelFacts | None] | None = None,
) -> Workload:
    """The workload to replay: the file when given, else the target's stored window (ConfigError naming what to
    pass when there is none). ``in_force`` and ``model``: the flags in force and the model's facts where the caller
    has read them (else read here, when the window's limit needs them)."""
    if path:
        try:
            text = read_text(path)
        except InputFileError as exc:  # missing, not UTF-8, larger than any workload
            raise ConfigError(path, "", f"cannot read the workload file: {exc.reason}") from None
        return parse_workload(text, path)
    t = cfg.target(target)
    if t.backend != "vllm":
        raise ConfigError(
            "tuner tune",
            "--workload",
            f"{target} is {t.backend}: its metrics carry no request lengths; pass a workload file",
        )
    limit, source = _limit_in_force(
        t,
        flags_in_force(store.engine, t) if in_force is None else in_force,
        model or (_Model(t.managed.model) if t.managed is not None else lambda: None),
    )
    w = (
        from_window(store.window(target, now - window_s, now), max_model_len=limit, limit_source=source)
        if target in store.target_names()
        else None
    )
    if w is None:
        raise ConfigError(
            "tuner tune",
            "--workload",
            f"{target} finished no request in the last {window_s:g}s of "
            "stored data; pass --workload FILE or a longer --window",
        )
    return w


def _limit_in_force(
    t: Target, flags: Mapping[str, Any], model: Callable[[], ModelFacts | None]
) -> tuple[int | None, str]:
    """The max-model-len the target serves with, and where that was read; (None, "") when unknown."""
    if flags.get("max_model_len"):
        return int(flags["max_model_len"]), "the flags in force"
    if t.managed is not None and Path(t.managed.model).is_dir():
        try:
            facts = model()
        except TunerError:
            return None, ""
        if facts is not None:
            return facts.max_position_embeddings, "vLLM's default: the model's context"
    return None, ""


def reap_orphans(store: Store, say: Callable[[str], None], now: float) -> int:
    """Stop trial servers journaled running whose tuner is gone; mark their trials interrupted. The trials of a
    tune still at work in another process are its own: left alone."""
    n = 0
    for t in tj.orphans(store.engine, alive=mg.is_alive):
        note = "its tuner stopped before the trial finished"
        if t.pid is not None and mg.is_alive(t.pid, t.proc_start):
            how = mg.stop_server(mg.Running(t.pid, t.proc_start or 0, [], Path("/dev/null")), grace_s=5.0)
            note += f"; its server (pid {t.pid}) {how}"
            say(f"stopped the trial server left by an interrupted tune (pid {t.pid}): {how}")
            n += 1
        tj.finish_trial(
            store.engine,
            t.id,
            now=now,
            status=TrialStatus.INTERRUPTED,
            capacity_rps=None,
            detail={**t.detail, "note": note},
        )
    return n


def _advisor_seeds(
    cfg: Config,
    store: Store,
    t: Target,
    current: dict[str, Any],
    window_s: float,
    now: float,
    *,
    in_force: Mapping[str, Any],
    model: ModelFacts | None,
) -> tuple[list[tuple[str, dict[str, Any]]], list[dict[str, Any]]]:
    """The advisor's one-step proposals, as starting points (none when it has nothing, or no data), and those that
    are no candidate of this target, each with why (a backend switch: tuner/tune/space.py ``not_applied``). The
    advisor sees the flags in force and the model's facts set-up read, and the stored window's signals."""
    seeds: list[tuple[str, dict[str, Any]]] = []
    refused: list[dict[str, Any]] = []
    try:
        inputs = engine_inputs(cfg, store, t, window_s, now, given=in_force, model=model)
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
        g = groups.setdefault(
            kind,
            {"kind": kind, "count": 0, "reason": v.reason, "flags_in_force": False, "fix": PRUNE_KINDS.get(kind, "")},
        )
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
        fix += (
            f" (the workload's longest request is {workload.longest} tokens"
            + (f": {basis.note}" if basis is not None and basis.note else "")
            + ")"
        )
    return NothingToMeasureError(
        f"all {total} candidates were pruned; binding constraint: {g['reason']} "
        f"({g['count']} of {total}{whose}); fix: {fix}"
    )


@dataclass
class _Server:
    """A trial server up and healthy (journaled as trial ``tid``)."""

    tid: int
    server: mg.Running
    url: str
    log: Path
    started: float
    placed: Placement | None

    @property
    def placement(self) -> dict[str, Any] | None:
        return self.placed.as_json() if self.placed is not None else None


def _placement(ctx: _Ctx) -> Placement | None:
    """Where a vLLM CPU trial computes and where the client runs (tuner/tune/cores.py); None: vLLM's own binding
    (``--cpu-bind vllm``, a GPU, llama-server, or the target's env binds it itself)."""
    t = ctx.target
    assert t.managed is not None
    if (
        ctx.req.cpu_bind != "spread"
        or t.backend != "vllm"
        or not ctx.cpu_host
        or "VLLM_CPU_OMP_THREADS_BIND" in t.managed.env
    ):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    own = [ctx.bench.pid] if ctx.bench is not None and ctx.bench.pid else []
    return place(allowed, read_pinned(allowed, exclude=own))


def _launch(
    ctx: _Ctx, flags: dict[str, Any], label: str, what: str, *, placed: Placement | None = None
) -> _Server | Outcome:
    """Start a fresh trial server with ``flags`` and wait for its health gate; journaled before it starts. An
    Outcome when it did not run (its argv would not carry a flag: pruned) or did not start (crashed). ``placed``:
    the cores of a server it is compared with (both sides of a comparison compute on the same cores)."""
    t = ctx.target
    assert t.managed is not None
    shadow = t if ctx.on_target else t.model_copy(update={"url": f"http://127.0.0.1:{free_port()}"})
    port = shadow.url.rsplit(":", 1)[-1].split("/")[0]
    argv = mg.build_argv(shadow, flags)
    missing = missing_from_argv(t.backend, flags, argv)
    if missing:  # a trial is what it says or it does not run (feasible() refuses these first; this is the last word)
        ctx.say(f"  not started: its server would not run {', '.join(missing)}")
        return Outcome(
            TrialStatus.PRUNED,
            0.0,
            {"reason": f"the server's argv would not carry {', '.join(missing)}", "kind": "not_applied"},
        )
    tid = tj.begin_trial(ctx.store.engine, ctx.run_id, now=ctx.clock(), flags=flags, seed=label, url=shadow.url)
    ctx.say(what)
    placed = placed or _placement(ctx)
    env = mg.server_env(t)
    if placed is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = placed.bind
        ctx.say(f"  cores: {placed.note}")
    if ctx.bench is not None:
        ctx.bench.pin(placed.client_cpus if placed is not None else None)
    log = ctx.log_dir / f"{t.name}-tune-{ctx.run_id}-{tid}.log"
    ctx.waiting[:] = [f"{what}: starting the server on :{port}"]
    server = mg.start_server(argv, env, log, nice=t.managed.nice, die_with_parent=True)
    tj.trial_started(ctx.store.engine, tid, pid=server.pid, proc_start=server.start)
    started = ctx.clock()
    try:
        mg.wait_healthy(server, shadow.url, t.managed.start_timeout.total_seconds())
        mg.yield_engine_core(server, t.managed.engine_core_nice)  # as production's (tuner/apply/servers.py)
    except ServerStartError as exc:
        error = mg.error_line(log)
        detail: dict[str, Any] = {"error": str(exc), "server_error": error, "log": str(log)}
        tj.finish_trial(
            ctx.store.engine, tid, now=ctx.clock(), status=TrialStatus.CRASHED, capacity_rps=0.0, detail=detail
        )
        ctx.say(f"  crashed: {error or exc} (recorded; this region is avoided)")
        return Outcome(TrialStatus.CRASHED, 0.0, detail)
    except BaseException as exc:
        mg.stop_server(server, grace_s=5.0)
        tj.finish_trial(
            ctx.store.engine,
            tid,
            now=ctx.clock(),
            status=TrialStatus.INTERRUPTED,
            capacity_rps=None,
            detail={"error": f"{type(exc).__name__}: {exc}"},
        )
        raise
    ctx.say(f"  healthy after {ctx.clock() - started:.0f}s{mg.yield_note(server)}")
    return _Server(tid, server, shadow.url, log, started, placed)


def _trial(ctx: _Ctx, flags: dict[str, Any], label: str, hw: Hardware) -> Outcome:
    """Start one trial server with ``flags``, bracket its capacity, stop it; journaled throughout."""
    t, req = ctx.target, ctx.req
    assert t.managed is not None and ctx.workload is not None
    got = _launch(
        ctx,
        flags,
        label,
        f"trial {ctx.trial_no + 1}/{req.budget}{' (' + label + ')' if label else ''}: {_flag_text(flags)}",
    )
    if isinstance(got, Outcome):
        ctx.trial_no += got.status != TrialStatus.PRUNED
        return got
    ctx.trial_no += 1
    try:
        slots = _slots(t.backend, flags, hw, got.url, say=ctx.say)
        cap = {**_capacity(ctx, got.url, slots=slots), "slots": slots}
    except BaseException as exc:
        mg.stop_server(got.server, grace_s=5.0)
        tj.finish_trial(
            ctx.store.engine,
            got.tid,
            now=ctx.clock(),
            status=TrialStatus.INTERRUPTED,
            capacity_rps=None,
            detail={"error": f"{type(exc).__name__}: {exc}"},
        )
        raise
    ctx.waiting[:] = [f"trial {ctx.trial_no}: stopping the trial server"]
    mg.stop_server(got.server, grace_s=5.0)
    detail = {**cap, "log": str(got.log), "start_s": round(ctx.clock() - got.started, 1), "placement": got.placement}
    tj.finish_trial(
        ctx.store.engine,
        got.tid,
        now=ctx.clock(),
        status=TrialStatus.MEASURED,
        capacity_rps=cap["capacity_rps"],
        detail=detail,
    )
    ctx.best_rps = max(ctx.best_rps, cap["capacity_rps"])
    in_flight = cap.get("in_flight")
    there = f"; {in_flight:.1f} requests in flight at that rate" if isinstance(in_flight, (int, float)) else ""
    ctx.say(f"  capacity {cap['capacity_rps']:.3g} req/s within the SLO ({cap['note']}{there})")
    return Outcome(TrialStatus.MEASURED, cap["capacity_rps"], detail)


def _slots(
    backend: str,
    flags: dict[str, Any],
    hw: Hardware,
    url: str | None = None,
    *,
    say: Callable[[str], None] | None = None,
) -> int | None:
    """How many requests a trial server runs at once: its max-num-seqs, or vLLM's own default when the flag is left
    out (128 on a CPU host: a search from vLLM's defaults otherwise doubles from the workload's rate and ends at a lower
    bound far below the server's capacity); llama-server's --parallel when given, else what the running server at
    ``url`` says it runs (its build's default, ``served_slots``: told to ``say``, as no flag shows it); None where
    neither says."""
    if backend == "vllm":
        tp = int(flags.get("tensor_parallel_size") or 1)
        return int(
            flags.get("max_num_seqs")
            or vllm_batch_defaults(hw.gpu_memory_bytes, hw.gpu_name, tensor_parallel_size=tp)[0]
        )
    got = flags.get("parallel")
    if got:
        return int(got)
    said = served_slots(url) if url else None
    if say is not None:
        say(f"  {said or 'no'} slots, as the server says (--parallel left out: its build's default)")
    return said


def served_slots(url: str) -> int | None:
    """The slots a running llama-server says it runs (GET /props, ``total_slots``): with --parallel left out, its
    build's default (4 on this machine's build, ``n_slots = 4`` in its log), which no flag says. A search from
    llama-server's defaults knew no slot count: its ladder doubled from the workload's rate and ran out of runs at a
    lower bound (held-back drawn-8289-2: 3.48 req/s with every rate met, the grid's best 21.1 at 4 slots). None where
    the server does not answer or says no positive count."""
    said = llamacpp.props(url, timeout_s=_PROPS_TIMEOUT_S)
    return said.total_slots if said is not None else None


def _run_size(ctx: _Ctx, rate: float, *, bursts: bool = True) -> int:
    """Requests in one run at ``rate``: ``--run-seconds`` of load, and never fewer than the objective needs
    (tuner/tune/compare.py ``min_requests``: 200 for 0.99, 40 for 0.95) nor than ``min_prompts``; times the
    workload's ``burst_factor`` (1 / burstiness below 1, at most 5: bursty arrivals miss in clumps), unless
    ``bursts`` is False."""
    assert ctx.target.slo is not None
    size = max(min_requests(ctx.target.slo.objective, ctx.req.min_prompts), int(rate * ctx.req.run_s))
    if not bursts or ctx.workload is None:
        return size
    return math.ceil(size * burst_factor(ctx.workload.burstiness))


def _capacity(ctx: _Ctx, url: str, *, slots: int | None = None) -> dict[str, Any]:
    t, req, w = ctx.target, ctx.req, ctx.workload
    assert t.managed is not None and w is not None and t.slo is not None
    client = ctx.bench
    model, tokenizer = t.served_name, ctx.tokenizer

    def measure(rate: float) -> Any:
        prompts = _run_size(ctx, rate)
        ctx.waiting[:] = [f"trial {ctx.trial_no}: {prompts} requests at {rate:.3g} req/s"]
        # every rate of every trial meets the same arrival pattern, scaled to its rate (common random numbers)
        run = client.run(
            w, url=url, model=model, tokenizer=tokenizer, rate=rate, prompts=prompts, slo=t.slo, arrivals=0
        )
        ctx.say(
            f"    {rate:7.3g} req/s: {run.good}/{run.sent} within the SLO ({run.attainment:.1%}), "
            f"P99 TTFT {run.ttft_p99 or 0:.2f}s, E2E {run.e2e_p99 or 0:.2f}s"
        )
        return run

    start = ctx.best_rps or w.rate_rps or 1.0
    # A fresh server's first run is slower than the ones after it (measured here: 46/48 then 48/48 and 48/48 at the
    # same rate, twice, even after 16 concurrent warm-up requests): one run at the start rate warms it and is
    # discarded, as the bracket's runs' own two warm-up requests are.
    ctx.waiting[:] = [f"trial {ctx.trial_no}: warming the server up ({req.min_prompts} requests, not counted)"]
    warm = client.run(w, url=url, model=model, tokenizer=tokenizer, rate=start, prompts=req.min_prompts, slo=t.slo)
    cap = find_capacity(
        measure,
        t.slo.objective,
        start_rps=start,
        tolerance=req.tolerance,
        max_runs=req.max_runs,
        # the floor as for Poisson arrivals: a bursty workload's runs are longer by design, not a sign of a hopeless
        # config
        floor_rps=rate_floor(_run_size(ctx, 0.0, bursts=False), req.run_s, w.rate_rps),
        slots=slots,
    )
    return {**cap.as_json(), "warmup": warm.as_json()}


def _compare_rate(base: Any, best_rps: float) -> float:
    """The rate the comparison runs at: where the two measurements predict different outcomes, between the lowest
    rate the flags in force missed and the highest the winner met (their geometric mean); when the two intervals
    overlap, the winner's own capacity (the flags in force may or may not serve it: that is the question)."""
    missed = base.get("hi_rps")
    return math.sqrt(missed * best_rps) if isinstance(missed, (int, float)) and 0 < missed < best_rps else best_rps


def _contest(measured: list[Point], current: dict[str, Any]) -> tuple[Point, float, float | None] | None:
    """What the comparison in turns settles: the flags in force against the best other config measured, at the rate
    where their two measurements predict different outcomes. Whichever way the measurements one after the other
    point: a candidate measured below the flags in force is compared too, since "worse" from fresh servers minutes
    apart is no more a ranking than "better" (the same flags spread ±15-24% on fresh servers here). None when the
    flags in force or no other config were measured. With the rate, the lower of the two capacities (None when 0):
    the rate both served one after the other, which the comparison does not go below."""
    base = next((p for p in measured if point_key(p.flags) == point_key(current)), None)
    other = next((p for p in _ranked(measured) if p is not base), None)
    if base is None or other is None:
        return None
    b, o = base.outcome, other.outcome
    served = min(b.capacity_rps, o.capacity_rps) or None
    if o.capacity_rps > b.capacity_rps:
        return other, _compare_rate(b.detail, o.capacity_rps), served
    return other, _compare_rate(o.detail, b.capacity_rps), served


def _compare(
    ctx: _Ctx, base: dict[str, Any], best: dict[str, Any], rate: float, *, both: bool, served: float | None = None
) -> dict[str, Any]:
    """The flags in force (A) and the candidate (B) on fresh servers, run in turns from ``rate`` (A B B A A B ...)
    until tuner/tune/compare.py decides or ``--compare-pairs`` pairs are spent. Where both fall short, the next pair
    runs lower, not below ``served`` (``TurnRate``); each rate's runs are pooled apart. ``both``: the two servers are
    up at once (room for two beside production); otherwise each turn restarts its side (each start warmed up)."""
    t, w, req = ctx.target, ctx.workload, ctx.req
    assert t.slo is not None and w is not None
    servers: dict[str, _Server] = {}
    runs: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    flags = {"A": base, "B": best}
    at = TurnRate(rate, served)
    moved: list[str] = []  # the rates left behind, and why
    prompts = _run_size(ctx, rate)
    decision = Decision("undecided", 0.0, "not run")
    cores: list[Placement] = []  # the first side's placement, the other's too

    def up(side: str) -> _Server | None:
        if side in servers:
            return servers[side]
        if not both:
            for other in list(servers):
                _down(other)
        got = _launch(
            ctx,
            flags[side],
            f"compare: {'flags in force' if side == 'A' else 'candidate'}",
            f"compare {side} ({'the flags in force' if side == 'A' else 'the candidate'}): {_flag_text(flags[side])}",
            placed=cores[0] if cores else None,
        )
        if isinstance(got, Outcome):
            return None
        servers[side] = got
        if not cores and got.placed is not None:
            cores.append(got.placed)
        ctx.waiting[:] = [f"compare {side}: warming the server up"]
        ctx.bench.run(
            w,
            url=got.url,
            model=t.served_name,
            tokenizer=ctx.tokenizer,
            rate=at.rate,
            prompts=req.min_prompts,
            slo=t.slo,
        )
        return got

    def _down(side: str) -> None:
        s = servers.pop(side)
        mg.stop_server(s.server, grace_s=5.0)
        tj.finish_trial(
            ctx.store.engine,
            s.tid,
            now=ctx.clock(),
            status=TrialStatus.COMPARED,
            capacity_rps=None,
            detail={"rate_rps": at.rate, "runs": runs[side], "log": str(s.log), "placement": s.placement},
        )

    ctx.say(
        f"compare: {_flag_text(_diff(base, best))} against the flags in force at {rate:.3g} req/s, in turns, "
        f"{prompts} requests a run"
    )
    try:
        for pair in range(req.compare_pairs):
            prompts = _run_size(ctx, at.rate)
            for side in ("A", "B") if pair % 2 == 0 else ("B", "A"):
                s = up(side)
                if s is None:
                    return {
                        "flags": dict(best),
                        "outcome": "undecided",
                        "confidence": 0.0,
                        "rate_rps": at.rate,
                        "runs": runs,
                        "reason": f"the {side} server did not start",
                    }
                ctx.waiting[:] = [f"compare {side}: {prompts} requests at {at.rate:.3g} req/s"]
                run = ctx.bench.run(
                    w,
                    url=s.url,
                    model=t.served_name,
                    tokenizer=ctx.tokenizer,
                    rate=at.rate,
                    prompts=prompts,
                    slo=t.slo,
                    arrivals=pair,  # the two of a pair meet the same arrivals; each pair its own
                )
                runs[side].append(run.as_json())
                ctx.say(f"    {side} {at.rate:7.3g} req/s: {run.good}/{run.sent} within the SLO ({run.attainment:.1%})")
            here = {k: [r for r in v if r["rate_rps"] == at.rate] for k, v in runs.items()}  # each rate pooled apart
            count = {k: (sum(r["good"] for r in v), sum(r["sent"] for r in v)) for k, v in here.items()}
            decision = decide(
                t.slo.objective,
                *count["A"],
                *count["B"],
                rate=at.rate,
                pairs=len(here["A"]),
                final=pair == req.compare_pairs - 1,
                deff=design_effect(here["A"] + here["B"]),
            )
            if decision.outcome != "undecided" or pair == req.compare_pairs - 1:
                break
            share = {k: g / n if n else 0.0 for k, (g, n) in count.items()}
            nxt = at.after(t.slo.objective, share["A"], share["B"])
            if nxt.rate != at.rate:  # up where both met, down where both fell short
                moved.append(
                    f"at {at.rate:.3g} req/s both {'met' if nxt.rate > at.rate else 'fell short of'} the objective (the "
                    f"candidate {count['B'][0]}/{count['B'][1]}, the flags in force {count['A'][0]}/{count['A'][1]})"
                )
                ctx.say(f"  {moved[-1]}: on at {nxt.rate:.3g} req/s")
                at = nxt
    finally:
        for side in list(servers):
            _down(side)
    reason = "; ".join([*moved, decision.reason])
    ctx.say(f"  {decision.outcome}: {reason}")
    return {
        "flags": dict(best),
        "outcome": decision.outcome,
        "confidence": round(decision.confidence, 4),
        "rate_rps": at.rate,
        "rates": list(dict.fromkeys(r["rate_rps"] for r in runs["A"])),  # in the order run
        "reason": reason,
        "pairs": len(runs["A"]),
        "requests_per_run": prompts,
        "both_up": both,
        "runs": runs,
    }


def _ranked(points: list[Point]) -> list[Point]:
    return sorted(points, key=lambda p: (p.outcome.status != TrialStatus.MEASURED, -p.outcome.capacity_rps))


def _diff(current: dict[str, Any], best: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in best.items() if current.get(k) != v}


def _window_time(t: Target, now: float) -> float:
    """Seconds of the open maintenance window that trials on the target may use (the restart of production after
    them is kept inside it); ConfigError naming the key when no window is open."""
    key = f"targets[{t.name}].apply.maintenance_windows"
    windows = [parse_window(w) for w in t.apply.maintenance_windows]
    if not windows:
        raise ConfigError(
            "config",
            key,
            "--on-target stops production for the trials: set the windows it may do "
            "that in, e.g. ['daily 02:00-04:00'] (UTC)",
        )
    left = window_left(windows, now)
    assert t.managed is not None
    margin = t.managed.start_timeout.total_seconds() + t.managed.drain_timeout.total_seconds()
    if left <= margin:
        when = "no window is open now" if left == 0 else f"the open window closes in {left:.0f}s"
        listed = ", ".join(t.apply.maintenance_windows)
        raise ConfigError(
            "config",
            key,
            f"--on-target runs only inside a maintenance window ({listed} UTC); {when}, "
            f"and production needs {margin:.0f}s (drain + start) to be back before it "
            "closes",
        )
    return left - margin


@contextmanager
def _target_taken(ctx: _Ctx, current: dict[str, Any]) -> Iterator[None]:
    """On-target trials: production drained for the body and started again with ``current`` after it, journaled in
    the run's entry of kind ``tune`` (``ctx.hold``, which holds the target already). Nothing to do in shadow mode."""
    if not ctx.on_target:
        yield
        return
    t, engine, ap, aid = ctx.target, ctx.store.engine, ctx.applier, ctx.hold
    argv = mg.build_argv(t, current)
    r = ap.running(t)
    ap.step(
        aid,
        ApplyStep.DRAINING,
        f"tuning run {ctx.run_id} on the target: " + (f"pid {r.pid}" if r else "no server running"),
        state=ApplyState.DRAINING,
    )
    if r is not None:
        ctx.waiting[:] = [f"draining {t.name} for the trials"]
        ap.step(aid, ApplyStep.STOPPED, ap.drain(t, r))
    ap.servers.save(t, None, current, ServerState.STOPPED, note=f"tuning run {ctx.run_id} on the target")
    ap.step(aid, ApplyStep.TUNING, f"trials on {t.url}", state=ApplyState.TUNING)
    failed: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        failed = exc
        raise
    finally:
        ctx.waiting[:] = [f"starting {t.name} again with the flags in force"]
        ap.step(aid, ApplyStep.RESTORING, json.dumps(argv), state=ApplyState.STARTING)
        try:
            ap.launch(t, current)
        except ServerStartError as exc:
            first = str(exc).splitlines()[0]
            ap.step(aid, ApplyStep.RESTORE_FAILED, first)
            jr.finish(
                engine,
                aid,
                ApplyOutcome.FAILED,
                f"tuned on the target; starting it again with the flags in force FAILED: {first}",
                now=ctx.clock(),
            )
            if failed is None:
                raise ApplyError(
                    f"{t.name}: trials done, but it did not start again with the flags in force: "
                    f"{first}; `tuner managed start {t.name}` once the cause is fixed"
                ) from None
        else:
            ap.step(aid, ApplyStep.RESTORED, "the flags in force, healthy")
            how = "stopped early: " + type(failed).__name__ if failed is not None else "trials done"
            jr.finish(
                engine,
                aid,
                ApplyOutcome.UNCHANGED,
                f"tuning run {ctx.run_id} on the target ({how}); the flags in force restored and healthy",
                now=ctx.clock(),
            )


@contextmanager
def _held(ap: Applier, t: Target, in_force: dict[str, Any], *, on_target: bool) -> Iterator[list[Any]]:
    """The run's entry in the apply journal, holding ``t`` and its replica group for the whole run (TargetBusyError
    naming what holds it otherwise: nothing is journaled then). Yields ``[entry id, run id]``; the entry is closed
    at the end unless the on-target restore closed it."""
    argv = mg.build_argv(t, in_force)
    aid = ap.hold(
        t,
        kind="tune",
        mode="manual" if on_target else "shadow",
        old_flags=in_force,
        new_flags=in_force,
        old_argv=argv,
        new_argv=argv,
    )
    if not on_target:
        ap.step(aid, ApplyStep.TUNING, "trials on spare ports beside production (shadow mode)", state=ApplyState.TUNING)
    ids: list[Any] = [aid, None]
    how = "done"
    try:
        yield ids
    except BaseException as exc:
        how = f"stopped: {type(exc).__name__}"
        raise
    finally:
        try:
            if jr.get_apply(ap.engine, aid).state != ApplyState.DONE:
                run = f"tuning run {ids[1]}" if ids[1] is not None else "the tuning run"
                jr.finish(
                    ap.engine,
                    aid,
                    ApplyOutcome.UNCHANGED,
                    f"{run} ({how}); "
                    + (
                        "production was not drained"
                        if on_target
                        else "its trials ran beside production, which was not touched"
                    ),
                    now=ap.clock(),
                )
        finally:
            ap.release(aid)


def tune(
    cfg: Config,
    store: Store,
    req: TuneRequest,
    *,
    config_dir: Path,
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.time,
    waiting: list[str] | None = None,
) -> dict[str, Any]:
    """Run a tuning session; the result as `tuner tune --json` prints it (docs/tune.md)."""
    now = clock()
    reap_orphans(store, say, now)
    t = cfg.target(req.target)
    where = f"targets[{t.name}]"
    if t.managed is None:
        raise ConfigError(
            "config",
            f"{where}.managed",
            "tuner tune starts trial servers from the target's managed section (model, executable): add one",
        )
    if t.slo is None:
        raise ConfigError(
            "config",
            f"{where}.slo",
            "tuner tune measures capacity within the SLO: set ttft_p99 and/or e2e_p99 (and objective)",
        )
    if req.sampler not in ("tpe", "random", "grid"):
        raise ConfigError("tuner tune", "--sampler", f"{req.sampler!r}: expected tpe, random or grid")
    if req.budget < 1:
        raise ConfigError("tuner tune", "--budget", f"expected at least 1 trial, got {req.budget}")
    if req.cpu_bind not in ("spread", "vllm"):
        raise ConfigError("tuner tune", "--cpu-bind", f"{req.cpu_bind!r}: expected spread or vllm")
    if req.compare_pairs < 1:
        raise ConfigError("tuner tune", "--compare-pairs", f"expected at least 1, got {req.compare_pairs}")
    max_time_s = req.max_time_s
    ap = Applier(cfg, store, config_dir, say=say, clock=clock, room=lambda t, f: second_server(store, t, f, clock()))
    if req.on_target:
        max_time_s = min(max_time_s, _window_time(t, now))
        # an on-target tune (or apply) whose tuner died left production down or changed: put it back first
        for line in ap.reconcile():
            say(line)
    else:  # a shadow tune whose tuner died holds the target still: close it (production was never touched)
        for line in ap.reconcile(only=lambda a: a.kind == "tune" and a.mode == "shadow"):
            say(line)
    llama = t.backend != "vllm"
    client_python = req.client_python or (None if llama else t.managed.executable or "python3")
    if client_python is None:
        raise ConfigError(
            "tuner tune",
            "--client-python",
            "llama-server is loaded with vLLM's benchmark client too "
            "(the same client for both servers): give a Python that "
            "has vllm installed",
        )
    tokenizer = req.tokenizer or (None if llama else t.managed.model)
    if tokenizer is None:
        raise ConfigError(
            "tuner tune",
            "--tokenizer",
            "the benchmark client writes its prompts with a Hugging Face "
            "tokenizer: give a model directory or hub name whose "
            "tokenizer matches the GGUF's",
        )
    previous = tj.latest_run(store.engine, t.name) if req.resume else None
    if req.resume and previous is None:
        raise ConfigError("tuner tune", "--resume", f"no earlier tuning run of {t.name} to resume")
    # Read once for the whole set-up: the flags in force (as production runs them: its argv's order, restored as
    # is) and the model's facts, for the workload's limit, the memory model and the advisor's seeds.
    in_force = flags_in_force(store.engine, t)
    facts = _Model(t.managed.model)
    workload = (
        Workload.model_validate(previous.workload)
        if previous is not None
        else workload_of(
            cfg, store, t.name, window_s=req.window_s, path=req.workload_file, now=now, in_force=in_force, model=facts
        )
    )
    model = facts()
    hw, hw_json = hardware(store, t, now)
    if req.on_target:
        fits, why = True, f"trials on {t.name} itself (--on-target), production drained until the end"
    else:
        fits, why = shadow_fits(t, hw, hw_json, model)
    if not fits:
        raise ConfigError("tuner tune", "--on-target", f"no room for a trial server beside {t.name}: {why}")
    current = canonical(in_force)
    axes = axes_for(
        t.backend,
        current,
        longest=workload.longest,
        model_max_len=model.max_position_embeddings if model else None,
        on_gpu=hw_json["kind"] == "gpu",
        names=req.flags or None,
    )
    fixed = {k: v for k, v in current.items() if k not in {a.name for a in axes}}

    def check(flags: dict[str, Any]) -> Verdict:
        return feasible(t.backend, flags, model=model, hardware=hw, longest=workload.longest)

    slo_json = {
        k: (v.total_seconds() if hasattr(v, "total_seconds") else v)
        for k, v in t.slo.model_dump().items()
        if v is not None
    }
    request_json = {
        "budget": req.budget,
        "max_time_s": max_time_s,
        "flags": [a.name for a in axes],
        "sampler": req.sampler,
        "where": "on_target" if req.on_target else "shadow",
        "hardware": hw_json,
        "shadow_fit": why,
    }
    seeds = [("baseline", current)]
    not_candidates: list[dict[str, Any]] = []
    if req.sampler == "tpe":
        advised, not_candidates = _advisor_seeds(
            cfg, store, t, current, req.window_s, now, in_force=in_force, model=model
        )
        seeds += advised
        for nc in not_candidates:
            say(f"the advisor's {_flag_text(nc['diff'])} ({', '.join(nc['rules'])}): {nc['why']}")
    elif req.sampler == "grid":
        seeds = []
    # Nothing to measure is an error, found before anything starts (or is journaled): every point of the space and
    # every seed refused.
    space = [*list(_grid(axes, fixed)), *[canonical({**fixed, **f}) for _, f in seeds]]
    verdicts = [(f, check(f)) for f in space]
    if not any(v.ok for _, v in verdicts):
        unique = {point_key(f): (f, v) for f, v in verdicts}
        groups = _prune_groups(list(unique.values()), current)
        for g in groups:
            say(f"pruned {g['count']:>5} x {g['kind']}: {g['reason']}")
        raise _nothing_to_measure(groups, len(unique), workload)
    with _held(ap, t, in_force, on_target=req.on_target) as held:  # the target is this run's until it ends
        history: list[Point] = []
        if previous is not None:
            run_id = previous.id
            for tr in tj.trials(store.engine, run_id):
                if tr.status in (TrialStatus.MEASURED, TrialStatus.CRASHED, TrialStatus.PRUNED):
                    history.append(Point(tr.flags, Outcome(tr.status, tr.capacity_rps or 0.0, tr.detail), tr.seed))
            tj.set_owner(store.engine, run_id, ap.owner, now=clock())  # its trials are this tuner's now
            say(f"resuming tuning run {run_id} of {t.name}: {len(history)} trials done")
        else:
            run_id = tj.begin_run(
                store.engine,
                target=t.name,
                now=now,
                request=request_json,
                workload=dump_workload(workload),
                slo=slo_json,
                baseline_flags=current,
                owner=ap.owner,
            )
        held[1] = run_id
        ctx = _Ctx(
            cfg,
            store,
            t,
            req,
            config_dir,
            say,
            clock,
            run_id=run_id,
            workload=workload,
            waiting=waiting if waiting is not None else [],
            log_dir=(config_dir / t.managed.log_dir).resolve(),
            on_target=req.on_target,
            applier=ap,
            hold=held[0],
            cpu_host=hw_json["kind"] != "gpu",
        )
        ctx.trial_no = sum(1 for p in history if p.outcome.status != TrialStatus.PRUNED)
        ctx.best_rps = max((p.outcome.capacity_rps for p in history), default=0.0)
        say(
            f"tuning {t.name}: workload {workload.input_len} in / {workload.output_len} out tokens "
            f"(range {workload.range_ratio:g}, prefix {workload.prefix_len}), burstiness {workload.burstiness:g}, "
            f"from {workload.source}; SLO {slo_json}; {why}"
        )
        basis = (workload.inferred or {}).get("max_request_tokens")
        say(f"the longest request: {workload.longest} tokens" + (f" ({basis.note})" if basis is not None else ""))
        say(
            f"searching {', '.join(a.name for a in axes)} around {_flag_text(current)}; budget {req.budget} trials, "
            f"{max_time_s:g}s"
        )
        noise_budget = 1 if req.noise_check and req.budget >= 3 else 0  # the comparison in turns
        carry = workload_flags(axes, workload)
        if carry and req.sampler == "tpe":
            say(
                f"the workload argues for {_flag_text(carry)}: the search's steps along "
                f"{'max-num-seqs' if t.backend == 'vllm' else '--parallel'} set it"
            )
        try:
            closes = backend_of(t.backend).bench_closes_connections
            with (
                BenchClient(client_python, ctx.log_dir / f"tune-{run_id}", close_connections=closes) as client,
                _target_taken(ctx, in_force),
            ):
                ctx.bench, ctx.tokenizer = client, tokenizer

                def measure(flags: dict[str, Any], label: str) -> Outcome:
                    try:
                        return _trial(ctx, flags, label, hw)
                    except BenchError as exc:
                        return Outcome(TrialStatus.CRASHED, 0.0, {"error": str(exc)})

                def pruned(flags: dict[str, Any], v: Verdict) -> None:
                    tj.begin_trial(
                        store.engine,
                        run_id,
                        now=clock(),
                        flags=flags,
                        seed="",
                        url="",
                        status=TrialStatus.PRUNED,
                        capacity_rps=0.0,
                        detail={"reason": v.reason, "kind": v.kind, "memory": dict(v.memory)},
                    )

                points = list(history) + search(
                    axes,
                    fixed,
                    measure=measure,
                    feasible=check,
                    seeds=seeds,
                    budget=req.budget - noise_budget,
                    max_time_s=max_time_s - (clock() - now),
                    clock=clock,
                    history=history,
                    on_pruned=pruned,
                    seed=req.seed,
                    sampler=req.sampler,
                    gallop="max_num_seqs" if t.backend == "vllm" else "parallel",
                    carry=carry,
                    along=step_budget(t.backend, axes, workload),
                )
                measured = [p for p in points if p.outcome.status == TrialStatus.MEASURED]
                comparison = None
                contest = _contest(measured, current) if noise_budget else None
                if contest is not None:
                    other, rate, served = contest
                    both = not req.on_target and shadow_fits(t, hw, hw_json, model, servers=2)[0]
                    comparison = _compare(ctx, current, dict(other.flags), rate, both=both, served=served)
        except BaseException as exc:
            tj.finish_run(
                store.engine,
                run_id,
                now=clock(),
                state=RunState.FAILED,
                result={},
                note=f"stopped: {type(exc).__name__}: {exc}",
            )
            raise
        result = _result(ctx, points, current, workload, slo_json, comparison, axes=[a.name for a in axes])
        result["not_candidates"] = not_candidates
        counts = result["counts"]
        if not counts[TrialStatus.MEASURED] and not counts[TrialStatus.CRASHED] and counts[TrialStatus.PRUNED]:
            refused = [
                (
                    dict(p.flags),
                    Verdict(False, p.outcome.detail.get("reason", ""), {}, p.outcome.detail.get("kind", "")),
                )
                for p in points
            ]
            groups = _prune_groups(refused, current)
            tj.finish_run(
                store.engine,
                run_id,
                now=clock(),
                state=RunState.FAILED,
                result=result,
                note="every candidate visited was pruned",
            )
            raise _nothing_to_measure(groups, len(refused), workload)
        rec_id = _recommend(ctx, result, current)
        result["recommendation_id"] = rec_id
        tj.finish_run(store.engine, run_id, now=clock(), state=RunState.DONE, result=result)
        return result


def _interval(d: Any) -> list[float | None]:
    """A measured capacity's interval: the highest rate that met the objective and the lowest that missed it (None:
    none missed up to the ceiling), that one at the speed of the runs that met (``hi_same_speed_rps``: where the
    server stepped slower when it missed, the miss may be the host's); the true capacity lies between."""
    hi = d.get("hi_same_speed_rps")
    return [d.get("lo_rps"), hi if isinstance(hi, (int, float)) else d.get("hi_rps")]


def _trial_json(p: Point, best: Point | None = None) -> dict[str, Any]:
    d = p.outcome.detail
    measured = p.outcome.status == TrialStatus.MEASURED
    out = {
        "flags": dict(p.flags),
        "capacity_rps": p.outcome.capacity_rps if measured else None,
        "ttft_p99": d.get("ttft_p99"),
        "e2e_p99": d.get("e2e_p99"),
        "status": p.outcome.status,
        "seed": p.seed,
        "note": d.get("note") or d.get("reason") or d.get("server_error") or d.get("error") or "",
        "memory": d.get("memory") or {},
    }
    if measured:
        out["interval"] = _interval(d)
        out["speed_spread"] = d.get("speed_spread")  # how much slower its slowest run stepped than its fastest
        # where attainment crossed the objective, read from every run (tuner/tune/capacity.py): a point estimate that
        # repeats closer than the capacity's rung; None for a trial measured before it was recorded
        out["crossing_rps"] = d.get("crossing_rps")
        if best is not None:
            out["vs_best"] = _vs_best(p, best)
    return out


# how each side of a comparison in turns fared there, by its outcome: (the flags in force, the other config)
_IN_TURNS = {
    "a_better": ("better", "worse"),
    "b_better": ("worse", "better"),
    "same": ("same", "same"),
    "undecided": ("undecided", "undecided"),
}


def mark_in_turns(
    trials: list[dict[str, Any]], current: Mapping[str, Any], comparison: Mapping[str, Any] | None
) -> None:
    """Give the two configs compared in turns ``in_turns``: better, worse, same or undecided. Their ``vs_best`` was
    measured one after the other, on servers minutes apart, and a "best" that served less in turns must not read as
    the winner beside a verdict that keeps the flags in force."""
    if not comparison:
        return
    sides = _IN_TURNS.get(str(comparison.get("outcome")), ("undecided", "undecided"))
    keys = {point_key(current): sides[0], point_key(comparison.get("flags") or {}): sides[1]}
    for tr in trials:
        if tr["status"] == TrialStatus.MEASURED and point_key(tr["flags"]) in keys:
            tr["in_turns"] = keys[point_key(tr["flags"])]


def _vs_best(p: Point, best: Point) -> str:
    """``best``, ``below`` (it missed a rate the best met: beyond the two intervals), or ``not separable``."""
    if p is best:
        return "best"
    hi, best_lo = _interval(p.outcome.detail)[1], best.outcome.detail.get("lo_rps")
    return "below" if hi is not None and best_lo is not None and hi <= best_lo else "not separable"


def _result(
    ctx: _Ctx,
    points: list[Point],
    current: dict[str, Any],
    workload: Workload,
    slo: dict[str, Any],
    comparison: dict[str, Any] | None,
    *,
    axes: list[str],
) -> dict[str, Any]:
    measured = [p for p in points if p.outcome.status == TrialStatus.MEASURED]
    base = next((p for p in measured if point_key(p.flags) == point_key(current)), None)
    best = _ranked(measured)[0] if measured else None
    trials = [_trial_json(p, best) for p in _ranked(points) if p.outcome.status != TrialStatus.PRUNED]
    mark_in_turns(trials, current, comparison)
    return {
        "target": ctx.target.name,
        "run_id": ctx.run_id,
        "workload": dump_workload(workload),
        "slo": slo,
        "searched": axes,
        "trials": trials,
        TrialStatus.PRUNED: _prune_groups(
            [
                (
                    dict(p.flags),
                    Verdict(False, p.outcome.detail.get("reason", ""), {}, p.outcome.detail.get("kind", "")),
                )
                for p in points
                if p.outcome.status == TrialStatus.PRUNED
            ],
            current,
        ),
        "best": {
            "flags": dict(best.flags),
            "capacity_rps": best.outcome.capacity_rps,
            "interval": _interval(best.outcome.detail),
            "ttft_p99": best.outcome.detail.get("ttft_p99"),
            "e2e_p99": best.outcome.detail.get("e2e_p99"),
        }
        if best
        else None,
        "baseline": {
            "flags": dict(current),
            "capacity_rps": base.outcome.capacity_rps if base else None,
            "interval": _interval(base.outcome.detail) if base else None,
        },
        "comparison": comparison,
        "counts": {
            TrialStatus.MEASURED: len(measured),
            TrialStatus.CRASHED: sum(p.outcome.status == TrialStatus.CRASHED for p in points),
            TrialStatus.PRUNED: sum(p.outcome.status == TrialStatus.PRUNED for p in points),
        },
    }


def _baseline_best(result: dict[str, Any]) -> str:
    """The verdict when the flags in force measured highest: beyond the next best's interval, or not separable."""
    best = result["best"]
    others = [tr for tr in result["trials"] if tr["status"] == TrialStatus.MEASURED and tr["flags"] != best["flags"]]
    if not others:
        return "the flags in force are the only config measured"
    nxt = others[0]
    lo, hi = best["interval"]
    said = (
        f"the flags in force measured {best['capacity_rps']:.3g} req/s within the SLO ({lo:.3g}-"
        f"{'ceiling' if hi is None else format(hi, '.3g')}), the next best, {_flag_text(nxt['flags'])}, "
        f"{nxt['capacity_rps']:.3g}"
    )
    if nxt.get("vs_best") == "below":
        return (
            f"the flags in force are the best found: {said}, below them beyond both intervals (measured one after "
            "the other, not compared in turns)"
        )
    return f"no difference measurable at this budget: {said}, not separable from them (their intervals overlap)"


def _unbounded(base_lo: Any, req: TuneRequest) -> str:
    """Why a winner is not beyond flags in force that missed no rate: they met every rate tried, so their capacity
    is a lower bound with no top and nothing ranks the two (a llama-server search from its defaults met every rate up
    to 3.48 req/s in its runs, and one sequence's 13.9 was kept below it). What would settle it: more runs, or a
    comparison in turns. Empty where the flags in force met no rate either."""
    if not isinstance(base_lo, (int, float)) or base_lo <= 0:
        return ""
    turns = "--no-noise-check turned it off" if not req.noise_check else "a budget of 3 or more runs one"
    return (
        f" (the flags in force met every rate tried, up to {base_lo:.3g} req/s: their capacity lies above that, "
        f"not bracketed in {req.max_runs} runs, so nothing ranks the two; a larger --max-runs would bracket it, "
        f"a comparison in turns would rank them ({turns}))"
    )


def _candidate(result: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """A measured config of the result in the shape of its ``best``: flags, capacity, interval, P99s."""
    tr = next(tr for tr in result["trials"] if tr["flags"] == flags)
    return {k: tr.get(k) for k in ("flags", "capacity_rps", "interval", "ttft_p99", "e2e_p99")}


def _recommend(ctx: _Ctx, result: dict[str, Any], current: dict[str, Any]) -> int | None:
    """Store a candidate as a recommendation when it serves more within the SLO than the flags in force beyond the
    measurement's reach: compared in turns (``comparison``, whichever way the capacities one after the other
    pointed) it must be ``b_better``; measured one after the other only, it must have met a rate the flags in force
    missed (disjoint intervals) and gained at least ``--tolerance``. Otherwise the verdict says why not, and nothing
    is stored."""
    best, base = result["best"], result["baseline"]
    if not best or base["capacity_rps"] is None:
        result["verdict"] = "no recommendation: " + (
            "nothing was measured" if not best else "the flags in force were not measured"
        )
        return None
    cmp = result.get("comparison")
    if cmp is not None and cmp.get("flags", best["flags"]) != best["flags"]:
        best = _candidate(result, cmp["flags"])  # the one compared in turns is judged: the runner-up when the base led
    diff = _diff(current, best["flags"])
    gain = best["capacity_rps"] / base["capacity_rps"] - 1 if base["capacity_rps"] else float("inf")
    measured = f"{base['capacity_rps']:.3g} -> {best['capacity_rps']:.3g} req/s within the SLO"
    base_lo, base_hi = base["interval"] or [None, None]  # the highest rate they met, the lowest they missed
    change = (  # a share of nothing is no number: say what the flags in force did not serve instead
        f"{gain:+.0%}"
        if math.isfinite(gain)
        else "the flags in force met no rate"
        + (f" down to {base_hi:.3g} req/s" if isinstance(base_hi, (int, float)) else "")
    )
    if not diff:
        result["verdict"] = _baseline_best(result)
        return None
    if cmp is not None:
        if cmp["outcome"] != "b_better":
            said = {
                "a_better": f"the flags in force serve more within the SLO than {_flag_text(diff)}",
                "same": f"no difference measurable at this budget between them and {_flag_text(diff)} (both "
                "served the rate compared)",
            }.get(cmp["outcome"], f"no difference measurable at this budget between them and {_flag_text(diff)}")
            result["verdict"] = (
                f"keep the flags in force: {said}: {_flag_text(diff)} measured {measured} one after the other, "
                f"and compared in turns {cmp['reason']}"
            )
            return None
        how, confidence = f"confirmed in turns: {cmp['reason']}", min(0.99, float(cmp["confidence"]))
        if gain <= 0:
            how = f"measured one after the other, but {how}"
    else:
        best_lo = best["interval"][0]
        if base_hi is None or best_lo is None or best_lo < base_hi or gain < ctx.req.tolerance:
            result["verdict"] = (
                f"keep the flags in force: {_flag_text(diff)} measured {measured} ({change}), "
                "not beyond the two measurements' intervals"
                + (
                    f" (the flags in force met up to {base_lo:.3g} and missed {base_hi:.3g})"
                    if base_hi is not None and base_lo is not None
                    else _unbounded(base_lo, ctx.req)
                )
            )
            return None
        how, confidence = (
            "measured one after the other, on servers minutes apart, not compared in turns ("
            + ("--no-noise-check" if not ctx.req.noise_check else "a budget of 3 or more compares them")
            + ")",
            0.6,
        )
    result["verdict"] = f"{_flag_text(diff)}: capacity {measured} ({change}); {how}"
    winner = next(tr for tr in result["trials"] if tr["flags"] == best["flags"])
    evidence = [
        {
            "rule": "tune",
            "run_id": ctx.run_id,
            "capacity_rps": best["capacity_rps"],
            "baseline_capacity_rps": base["capacity_rps"],
            "gain": round(gain, 4),
            "interval": best["interval"],
            "baseline_interval": base["interval"],
            "comparison": {k: v for k, v in (cmp or {}).items() if k != "runs"} or None,
            "ttft_p99": best["ttft_p99"],
            "e2e_p99": best["e2e_p99"],
            "trials": result["counts"],
            "workload": result["workload"],
            "slo": result["slo"],
        }
    ]
    same = next((r for r in recs.proposed_for(ctx.store.engine, ctx.target.name) if r.diff_key == diff_key(diff)), None)
    if same is not None:  # the advisor proposed this very change: it now carries the measurement too
        recs.renew_recommendation(
            ctx.store.engine,
            same.id,
            now=ctx.clock(),
            rules=list(dict.fromkeys([*same.rules, "tune"])),
            evidence=[e for e in same.evidence if e.get("rule") != "tune"] + evidence,
            confidence=max(same.confidence, confidence),
            memory_check=same.memory_check,
            current={**same.current, **{k: current.get(k) for k in diff}},
        )
        return same.id
    return recs.add_recommendation(
        ctx.store.engine,
        target=ctx.target.name,
        now=ctx.clock(),
        rules=["tune"],
        diff_key=diff_key(diff),
        diff=diff,
        current={k: current.get(k) for k in diff},
        evidence=evidence,
        expected_effect=(
            f"capacity within the SLO {base['capacity_rps']:.3g} -> {best['capacity_rps']:.3g} req/s (measured on a "
            "trial server with the workload replayed)"
            if gain > 0 or cmp is None
            else f"serves {cmp['rate_rps']:.3g} req/s within the SLO where the flags in force do not (compared in "
            f"turns on fresh servers; one after the other they measured {measured})"
        ),
        risk=(
            "measured on the target itself in its maintenance window"
            if ctx.on_target
            else "measured on a shadow server beside production"
        )
        + "; the live verdict judges it again after the apply",
        confidence=confidence,
        rank=1,
        memory_check={
            "ok": True,
            "reason": "passed the memory model before its trial started",
            "before": {},
            "after": winner.get("memory") or {},
        },
    )
