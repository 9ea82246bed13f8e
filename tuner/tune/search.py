"""The search over a space of flags: optuna's TPE sampler, seeded, budgeted, with infeasible and crashed points as data.

  * Seeds first, in order: the flags in force (the baseline every answer is compared with), then the advisor's
    one-step proposals, as optuna enqueued trials.
  * Each point the sampler asks for goes through ``feasible`` first (the memory model and vLLM's start-up checks,
    tuner/tune/space.py). An infeasible point is told to optuna as violating a constraint, costs no budget and
    never starts a server.
  * A point already measured (or refused) is not measured again: its recorded result is told once more.
  * A trial that crashes is recorded as data (capacity 0, constraint violated): the sampler learns the region,
    and the same point is never retried.
  * Then, with ``gallop`` (max-num-seqs for vLLM, --parallel for llama-server), an exponential search along that
    axis from the best point so far (``_gallop``), before the sampler's own proposals; its first step is long (x4 at
    least, and as far as what was in flight asks for) when that point queued requests at its capacity rate
    (``_first_step``, Little's law), x4 when arrivals found its slots all taken more often than the objective lets
    requests miss (``_waited``, Erlang C), and x4 when it met the SLO at no rate. Its steps carry ``carry``:
    flags the workload argues for (prefix caching for prompts that share a prefix, tuner/tune/space.py
    ``workload_flags``), so a small budget spent on the gallop does not leave them untried; and what ``along``
    brings with each step (tuner/tune/space.py ``step_budget``: the tokens a step the sequences added need, the
    context the slots added need).
  * Stops at ``budget`` measured trials or ``max_time_s`` (checked before each trial starts), or when the sampler
    keeps proposing known points (the space is exhausted).
Trials journaled by an earlier, interrupted run come back through ``history`` and count against the budget.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.store.tuning import TrialStatus
from tuner.tune.space import Axis, Verdict, canonical

__all__ = ["Along", "Outcome", "Point", "search", "point_key"]

_EXHAUSTED_AFTER = 60  # consecutive asks that bring nothing new

# What a gallop step brings along: (the point it steps from, the step's flags) -> flags to set with it.
Along = Callable[[Mapping[str, Any], Mapping[str, Any]], Mapping[str, Any]]


@dataclass(frozen=True)
class Outcome:
    """What measuring one point gave: its capacity, or why it has none."""

    status: str  # measured | crashed | pruned
    capacity_rps: float
    detail: Mapping[str, Any]


@dataclass(frozen=True)
class Point:
    flags: Mapping[str, Any]  # canonical: unset flags left out
    outcome: Outcome
    seed: str = ""  # "baseline", "advisor: <rule>", or "" for the sampler's own


def point_key(flags: Mapping[str, Any]) -> str:
    return json.dumps(canonical(flags), sort_keys=True)


def _params(axes: Sequence[Axis], flags: Mapping[str, Any]) -> dict[str, Any] | None:
    """optuna params (the index of each value on its axis) of ``flags``; None if a value is off its axis."""
    out = {}
    for a in axes:
        v = flags.get(a.name)
        if v not in a.values:
            return None
        out[a.name] = a.values.index(v)
    return out


def _first_step(axis: Axis, start: int, base: Point) -> int:
    """Positions the gallop's first step up takes. 1 (2 from a base with capacity 0), unless ``base`` queued
    requests at its capacity rate: more requests in flight there (``in_flight`` in its measurement: throughput x
    mean E2E, Little's law) than its own value of the axis allows to run. Then its slots were what bound it, the peak lies further up, and the first
    step takes at least 2 positions (x4 on a doubling axis), and as far as the first value that holds what was in
    flight: a server held to 2 sequences with 11 requests in flight at its capacity queued 9 of them, the traffic
    asks for ~16, and 2 -> 4 -> 8 -> 16 would spend two trials getting there. How many were in flight at the
    highest passing rate swings with how close that rate is to the true capacity (2.8 and 9.9 on two servers of the
    same config at the same 16 req/s, bench/results/2026-11-24-0743-tune-gallop.md): the queue is the steady
    signal, its size the rough one. A base that met no rate at all (capacity 0) carries the count from its run at
    the lowest rate tried (tuner/tune/capacity.py): one sequence that served nothing, with 20 requests in flight
    at the floor rate, steps to the first value that holds 20, not to 2; with no queue there (it missed on the
    latency of the few that waited), it still steps 2 positions: one position from nothing is the step that
    tells least, and a step that overshoots bisects back. A base with no queue on average (in flight at most its
    own value) still had its slots all taken at times: where that share of arrivals (``_waited``, Erlang C) is more
    than the objective lets miss, the slots bound its tail and the first step is 2 positions too. One sequence that
    served 0.6 requests in flight at its capacity (38% of arrivals waited, against a 0.95 objective's 5%) stepped
    1 -> 2 -> 8 and ended at 57% of the grid's best on a held-back shape whose peak was 32
    (bench/results/2026-11-29-0518-tune-corpus.md); 32 sequences with 21 in flight (2% waited) step one position."""
    want, have = _measured(base, "in_flight"), axis.values[start]
    if not isinstance(have, int) or isinstance(have, bool):
        return 1
    values = [(i, v) for i, v in enumerate(axis.values) if v is not None]  # None (the default) sorts first
    numbers = [(i, v) for i, v in values if isinstance(v, int) and not isinstance(v, bool)]
    if len(numbers) != len(values) or [v for _, v in numbers] != sorted(v for _, v in numbers):
        return 1  # not an ordered numeric axis
    # a base that met the SLO at no rate at all lies far from any config that does, queue or not (one sequence
    # missing on the TTFT of requests that waited behind the one running, 0.5 in flight): x4 at least, not x2
    least = 2 if base.outcome.capacity_rps <= 0 else 1
    if want is None:
        return least
    if want <= have:
        # no queue on average, but arrivals still found every slot taken: more often than the objective lets
        # requests miss, and the slots bound the tail too (one sequence with 0.6 in flight: 38% of arrivals
        # waited for it, against a 5% allowance). x4 at least, as from a base that queued
        objective = _objective(base)
        return max(least, 2) if objective is not None and _waited(have, want) > 1 - objective else least
    above = [i for i, v in numbers if v >= want]
    return max(2, (above[0] if above else len(axis.values) - 1) - start)


def _measured(base: Point, key: str) -> float | None:
    """A finite number ``base``'s measurement records under ``key``; None where it records none (or not a number)."""
    got = base.outcome.detail.get(key)
    if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
        return None
    return float(got)


def _objective(base: Point) -> float | None:
    """The share of requests the SLO asks to meet, as ``base`` was measured against; None where it does not say."""
    got = _measured(base, "objective")
    return got if got is not None and 0 < got < 1 else None


def _waited(slots: int, in_flight: float) -> float:
    """The share of arrivals that found all ``slots`` busy, for a server with ``in_flight`` requests in it on average
    (Erlang C: Poisson arrivals, exponential service, ``slots`` servers; the offered load solved from the mean in
    the system, L = a + C(slots, a) a / (slots - a)). A model, not a measurement: it says whether the slots were
    taken often enough to matter, which a mean below the slot count hides (0.6 in flight on one slot: 38%)."""
    if slots < 1 or in_flight <= 0:
        return 0.0

    def erlang_c(a: float) -> float:
        b = 1.0  # Erlang B by its recursion, stable for any slot count
        for k in range(1, slots + 1):
            b = a * b / (k + a * b)
        return slots * b / (slots - a * (1 - b))

    lo, hi = 0.0, float(slots)
    for _ in range(60):  # L(a) rises from 0 to infinity on [0, slots): bisection
        a = (lo + hi) / 2
        if a + erlang_c(a) * a / (slots - a) < in_flight:
            lo = a
        else:
            hi = a
    return erlang_c((lo + hi) / 2)


def _holding(axis: Axis, base: Point) -> int | None:
    """The position of the first value of an ordered numeric ``axis`` that holds the requests ``base`` had in flight
    at its capacity rate (its last where none does); None where the axis is not ordered numbers or the base's
    measurement does not say."""
    want = _measured(base, "in_flight")
    if want is None:
        return None
    values = [v for v in axis.values if isinstance(v, int) and not isinstance(v, bool)]
    if not values or len(values) != len(axis.values) or values != sorted(values):
        return None
    return next((i for i, v in enumerate(values) if v >= want), len(values) - 1)


def _gallop(
    axis: Axis,
    known: dict[str, Point],
    visit: Callable[[dict[str, Any], str], bool],
    may: Callable[[], bool],
    carry: Mapping[str, Any] | None = None,
    along: Along | None = None,
) -> None:
    """Exponential search along one axis from the best point so far: up first, by steps of k, 2k, 4k, ...
    positions while capacity rises (k from ``_first_step``: 1, or more when the base queued requests); a step past
    the end of the axis lands on its end (once). A step longer than one position that does not rise
    overshot the peak, which then lies between: the step halves from the same point (bisection) before the gallop
    gives up. If it never rose going up, the same down, by 1, 2, 4, ... Capacity against max-num-seqs (or
    --parallel) rises until the engine or the KV cache saturates and falls after, so this reaches the region of
    the peak in about log2(axis) trials. A best so far that runs the server's default (the axis's flag unset) has
    no position: its step is to the value that holds what it had in flight (``_holding``). Every step also sets
    ``carry``, and what ``along`` brings with it (a token budget for the sequences it adds), unless that point is
    refused (pruned) where the step without it is not."""
    measured = [p for p in known.values() if p.outcome.status == TrialStatus.MEASURED]
    if not measured:
        return
    base = max(measured, key=lambda p: p.outcome.capacity_rps)

    def take(j: int) -> Point | None:
        """The step from ``base`` to the axis's j-th value (with ``carry`` and what ``along`` brings): its point."""
        plain = canonical({**base.flags, **(carry or {}), axis.name: axis.values[j]})
        flags = canonical({**plain, **(along(base.flags, plain) if along is not None else {})})
        visit(flags, "gallop")
        p = known.get(point_key(flags))
        if flags != plain and p is not None and p.outcome.status == TrialStatus.PRUNED:
            visit(plain, "gallop")  # the budget brought along does not fit: the step without it
            p = known.get(point_key(plain))
        return p

    if base.flags.get(axis.name) not in axis.values:
        # the base runs the server's default, which is no value of the axis (vLLM's max-num-seqs left unset): no
        # position to step from, so one step to the value that holds what was in flight at its capacity rate, and
        # the gallop goes on from there where that served more
        j = _holding(axis, base)
        if j is None or not may():
            return
        p = take(j)
        if (
            p is not None
            and p.outcome.status == TrialStatus.MEASURED
            and p.outcome.capacity_rps > base.outcome.capacity_rps
        ):
            _gallop(axis, known, visit, may, carry, along)
        return
    start = axis.values.index(base.flags.get(axis.name))
    for direction in (1, -1):
        step = _first_step(axis, start, base) if direction == 1 else 1
        i, best, moved = start, base.outcome.capacity_rps, False
        while may():
            j = min(max(i + direction * step, 0), len(axis.values) - 1)
            if j == i:
                break
            p = take(j)
            if p is not None and p.outcome.status == TrialStatus.MEASURED and p.outcome.capacity_rps > best:
                i, best, step, moved = j, p.outcome.capacity_rps, step * 2, True
            elif abs(j - i) > 1:
                step = abs(j - i) // 2  # overshot: the peak is between i and j
            else:
                break
        if moved:  # it climbed this way: the peak is not the other way
            return


def search(
    axes: Sequence[Axis],
    fixed: Mapping[str, Any],
    *,
    measure: Callable[[dict[str, Any], str], Outcome],
    feasible: Callable[[dict[str, Any]], Verdict],
    seeds: Sequence[tuple[str, Mapping[str, Any]]],
    budget: int,
    max_time_s: float,
    clock: Callable[[], float],
    history: Sequence[Point] = (),
    on_pruned: Callable[[dict[str, Any], Verdict], None] | None = None,
    seed: int = 0,
    sampler: str = "tpe",
    gallop: str | None = None,
    carry: Mapping[str, Any] | None = None,
    along: Along | None = None,
) -> list[Point]:
    """Search ``axes`` (other flags held at ``fixed``); returns every point measured or refused, in order.

    ``sampler``: "tpe" (the default), "random" (optuna's RandomSampler: the baseline of the bench), or "grid"
    (every feasible point in axis order, seeds first: the exhaustive answer the bench scores against)."""
    if sampler not in ("tpe", "random", "grid"):
        raise ValueError(f"sampler {sampler!r}: expected tpe, random or grid")
    import optuna
    from optuna.distributions import CategoricalDistribution, IntDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists: dict[str, Any] = {
        a.name: (IntDistribution(0, len(a.values) - 1) if len(a.values) > 1 else CategoricalDistribution([0]))
        for a in axes
    }

    chosen: Any = (
        optuna.samplers.RandomSampler(seed=seed)
        if sampler == "random"
        else optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, min(5, budget // 3)), multivariate=True)
    )
    study = optuna.create_study(direction="maximize", sampler=chosen)
    known: dict[str, Point] = {}
    points: list[Point] = []
    t0 = clock()

    def tell(params: dict[str, Any], point: Point) -> None:
        bad = 0.0 if point.outcome.status == TrialStatus.MEASURED else 1.0
        study.add_trial(
            optuna.trial.create_trial(
                params=params, distributions=dists, value=point.outcome.capacity_rps, constraints={"runs": bad}
            )
        )

    for p in history:
        known[point_key(p.flags)] = p
        params = _params(axes, p.flags)
        if params is not None:
            tell(params, p)
    spent = sum(1 for p in history if p.outcome.status != TrialStatus.PRUNED)

    def flags_of(params: Mapping[str, int]) -> dict[str, Any]:
        return canonical({**fixed, **{a.name: a.values[int(params[a.name])] for a in axes}})

    def visit(flags: dict[str, Any], label: str) -> bool:
        """Measure or refuse ``flags``; False when it was known already."""
        nonlocal spent
        key = point_key(flags)
        if key in known:
            return False
        verdict = feasible(flags)
        if not verdict.ok:
            point = Point(
                flags,
                Outcome(TrialStatus.PRUNED, 0.0, {"reason": verdict.reason, "memory": dict(verdict.memory)}),
                label,
            )
            if on_pruned is not None:
                on_pruned(flags, verdict)
        else:
            point = Point(flags, measure(flags, label), label)
            spent += 1
        known[key] = point
        points.append(point)
        params = _params(axes, flags)
        if params is not None:
            tell(params, point)
        return True

    for label, s in seeds:
        if spent >= budget or clock() - t0 >= max_time_s:
            return points
        visit(canonical({**fixed, **s}), label)
    if sampler == "grid":
        import itertools

        for values in itertools.product(*[range(len(a.values)) for a in axes]):
            if spent >= budget or clock() - t0 >= max_time_s:
                break
            visit(flags_of(dict(zip([a.name for a in axes], values))), "grid")
        return points
    if sampler == "tpe" and gallop is not None and any(a.name == gallop for a in axes):
        _gallop(
            next(a for a in axes if a.name == gallop),
            known,
            visit,
            lambda: spent < budget and clock() - t0 < max_time_s,
            carry,
            along,
        )
    idle = 0
    while spent < budget and clock() - t0 < max_time_s and idle < _EXHAUSTED_AFTER:
        trial = study.ask(dists)
        flags = flags_of(trial.params)
        key = point_key(flags)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)  # asked only for its params; the told copy counts
        if key in known:
            idle += 1
            continue
        idle = 0
        visit(flags, "")
    return points
