"""How fast the server stepped during a run, read from the benchmark client's own timings. Pure.

A capacity is a rate the server met the SLO at, at the speed the host gave it then. On a shared host that speed
moves: five fresh vLLM CPU servers given the same bursty run (bench/results/2026-11-28-2232-host-drift.md) took
6.5-9.9 ms for a decode step of eight sequences, and met the SLO for 99% to 68% of the run in that order, with no
steal time to show for it. So every run carries its step times, and a search whose runs saw different speeds says so.

A decode step's time is the gap between two tokens of one request (the client's ``itls``). How many requests were
decoding at that moment is read from the same timings: a request decodes from its first token
(``start_times`` + ``ttfts``) to its last (+ the sum of its gaps). A gap in which another request got its first
token was a step that ran that request's prefill as well, and is left out: a busier run admits more requests a
second, and its steps would read slower for that alone (on drawn-2161-2, runs at 1.4-2x the capacity read 2-8%
slower with those steps than without). ``step_times`` gives, for each concurrency with at least ``MIN_GAPS`` such gaps, their
median: at equal concurrency, a slower step is a slower server, not a fuller batch. ``slowdown`` compares two runs at
the concurrencies both saw. The reading is weakest where answers are short: a run of 12-token answers at 32 slots
and one at a fifth of its rate share few concurrencies, and the gauge then says nothing rather than guess.

A client that falls behind reads several tokens at once: their gaps come out as microseconds, and the gap before them
holds the whole chunk. An overloaded run at 24 req/s on drawn-2161-2 read 3 us "steps" at 1-4 sequences that way,
and a search that held it reported its host 310x slower at one run than another (2026-11-30 20:56). A gap under a
tenth of the run's median gap, and the gap just before it, are left out.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MIN_GAPS", "MIN_LEVELS", "pooled", "slowdown", "spread", "step_times"]

MIN_GAPS = 30  # gaps at one concurrency before its median counts
MIN_LEVELS = 2  # concurrencies two runs must share to be compared (one level's median alone moves with one prefill)
_COALESCED = 0.1  # a gap under this share of the run's median gap is two tokens the client read at once
_EDGE = 0.1  # a first token this share of a gap past its end still came out of the same step (the two travel apart)


def step_times(result: Mapping[str, Any], min_gaps: int = MIN_GAPS, *, pure: bool = True) -> dict[int, float]:
    """Concurrency (requests decoding) -> the median gap between two tokens of one request at it, in seconds, from a
    ``--save-detailed`` result; concurrencies with fewer than ``min_gaps`` gaps are left out ({} without timings)."""
    starts, ttfts, itls = result.get("start_times") or [], result.get("ttfts") or [], result.get("itls") or []
    every = [g for gaps in itls if gaps for g in gaps if isinstance(g, (int, float)) and g > 0]
    floor = _COALESCED * statistics.median(every) if every else 0.0
    tokens: list[tuple[float, float]] = []  # (the moment between the two tokens, the gap)
    firsts, lasts = [], []
    for start, ttft, gaps in zip(starts, ttfts, itls, strict=False):
        if not isinstance(start, (int, float)) or not isinstance(ttft, (int, float)) or not ttft or not gaps:
            continue
        t = start + ttft
        firsts.append(t)
        kept = [g for g in gaps if isinstance(g, (int, float)) and g > 0]
        for i, gap in enumerate(kept):
            # tokens the client read together: the gaps after the first of them are ~0, and the one before them
            # holds the whole chunk's time; neither is a step
            if gap >= floor and (i + 1 == len(kept) or kept[i + 1] >= floor):
                tokens.append((t + gap / 2, gap))
            t += gap
        lasts.append(t)
    firsts.sort()
    lasts.sort()
    by_level: dict[int, list[float]] = defaultdict(list)
    for mid, gap in tokens:
        if pure:
            # a step in which another request got its first token ran that request's prefill too: left out
            a, b = mid - gap / 2, mid + gap / 2 + _EDGE * gap
            if bisect.bisect_right(firsts, b) - bisect.bisect_right(firsts, a):
                continue
        decoding = bisect.bisect_right(firsts, mid) - bisect.bisect_left(lasts, mid)
        by_level[decoding].append(gap)
    return {c: statistics.median(g) for c, g in sorted(by_level.items()) if c > 0 and len(g) >= min_gaps}


def _levels(steps: Mapping[Any, Any] | None) -> dict[int, float]:
    """A run's step times as stored (JSON keys are strings) -> {concurrency: seconds}."""
    out = {}
    for k, v in (steps or {}).items():
        try:
            c, s = int(k), float(v)
        except (TypeError, ValueError):
            continue
        if c > 0 and s > 0 and math.isfinite(s):
            out[c] = s
    return out


def slowdown(before: Mapping[Any, Any] | None, after: Mapping[Any, Any] | None) -> float | None:
    """How many times longer ``after``'s steps took than ``before``'s at the same concurrency: the median of the
    ratios over every concurrency both runs saw (a step that mixed in a long prefill moves one level's median, not
    the answer). None when they share fewer than ``MIN_LEVELS``."""
    a, b = _levels(before), _levels(after)
    common = sorted(set(a) & set(b))
    if len(common) < MIN_LEVELS:
        return None
    return statistics.median(b[c] / a[c] for c in common)


def pooled(runs: Iterable[Mapping[Any, Any] | None]) -> dict[int, float]:
    """Several runs' step times as one (runs of one rate): at each concurrency, the geometric mean of theirs."""
    logs: dict[int, list[float]] = defaultdict(list)
    for steps in runs:
        for c, s in _levels(steps).items():
            logs[c].append(math.log(s))
    return {c: math.exp(sum(v) / len(v)) for c, v in sorted(logs.items())}


def spread(runs: Iterable[Mapping[Any, Any] | None]) -> float | None:
    """How much slower the slowest run stepped than the fastest, as a ratio (1.0: the same speed), over the pairs of
    runs that share a concurrency. None when no two do."""
    steps = [s for s in (_levels(r) for r in runs) if s]
    worst = None
    for i, a in enumerate(steps):
        for b in steps[i + 1 :]:
            r = slowdown(a, b)
            if r is not None:
                worst = max(worst or 1.0, r, 1 / r)
    return worst
