"""Prometheus's own arithmetic, so tuner's numbers equal what a PromQL query over the same samples gives.

``increase`` is Prometheus 2.x's ``extrapolatedRate`` (counter resets, extrapolation to the range
boundaries, the zero-point clamp); ``histogram_quantile`` is its ``bucketQuantile`` (coalesced
buckets, monotonicity fix, linear interpolation, the lowest bucket starting at 0). A range
``[start, end]`` includes both ends, as Prometheus 2.x selects it.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

from tuner.store.window import HistPoints, HistSeries, Point, Points

__all__ = [
    "increase",
    "rate",
    "histogram_quantile",
    "histogram_quantiles",
    "bucket_increase",
    "fraction_le",
    "fraction_le_linear",
]


def increase(points: Sequence[Point], start_ms: int, end_ms: int, *, is_counter: bool = True) -> float | None:
    """``increase(x[range])`` evaluated at ``end_ms`` over points already cut to [start_ms, end_ms]."""
    if len(points) < 2:
        return None
    first_t, first_v = points[0]
    last_t, last_v = points[-1]
    result = last_v - first_v
    if is_counter and isinstance(points, Points):  # the head's: its falls are known, the same sum in the same order
        for _, prev in points.falls:
            result += prev
    elif is_counter:
        prev = 0.0
        for _, v in points:
            if v < prev:  # a reset: the counter restarted, count what it had reached
                result += prev
            prev = v
    return _extrapolated(result, first_t, first_v, last_t, len(points), start_ms, end_ms, is_counter)


def _extrapolated(
    result: float, first_t: int, first_v: float, last_t: int, n: int, start_ms: int, end_ms: int, is_counter: bool
) -> float | None:
    """The increase ``result`` seen between the first and the last of ``n`` points, extrapolated to the range."""
    duration_to_start = (first_t - start_ms) / 1000
    duration_to_end = (end_ms - last_t) / 1000
    sampled = (last_t - first_t) / 1000
    if sampled <= 0:
        return None
    average_step = sampled / (n - 1)
    if is_counter and result > 0 and first_v >= 0:
        # Counters start at zero: never extrapolate to before that point.
        duration_to_zero = sampled * (first_v / result)
        if duration_to_zero < duration_to_start:
            duration_to_start = duration_to_zero
    threshold = average_step * 1.1
    interval = sampled
    interval += duration_to_start if duration_to_start < threshold else average_step / 2
    interval += duration_to_end if duration_to_end < threshold else average_step / 2
    return result * (interval / sampled)


def rate(points: Sequence[Point], start_ms: int, end_ms: int) -> float | None:
    """``rate(x[range])``: per-second increase over the whole range."""
    inc = increase(points, start_ms, end_ms)
    return None if inc is None else inc / ((end_ms - start_ms) / 1000)


def bucket_increase(hist: HistSeries, start_ms: int, end_ms: int) -> tuple[float, ...] | None:
    """Per-bucket ``increase(h_bucket[range])``; each bucket is its own counter, as in Prometheus.

    The same arithmetic as ``increase`` on each bucket's points, in one pass over the points instead of one per
    bucket: a pair of points is looked into bucket by bucket only when some bucket fell (a reset)."""
    pts = hist.points
    if len(pts) < 2:
        return None
    n = len(hist.bounds)
    if isinstance(pts, HistPoints):  # the head's: decode the first and last rows and the rows around each fall
        first, last = pts.decode(pts.text(0)), pts.decode(pts.text(-1))
        first_t, last_t = pts.ts[0], pts.ts[-1]
        result = [last[i] - first[i] for i in range(n)]
        for _, before, at in pts.falls:
            _add_falls(result, pts.decode(before), pts.decode(at), n)
    else:
        first, last = pts[0].counts, pts[-1].counts
        first_t, last_t = pts[0].ts_ms, pts[-1].ts_ms
        result = [last[i] - first[i] for i in range(n)]
        prev = first
        for p in pts[1:]:
            cur = p.counts
            if any(map(operator.lt, cur, prev)):
                _add_falls(result, prev, cur, n)
            prev = cur
    if last_t <= first_t:
        return None
    # _extrapolated bucket by bucket, its shared terms once: only the zero-point clamp differs between buckets.
    to_start, to_end = (first_t - start_ms) / 1000, (end_ms - last_t) / 1000
    sampled = (last_t - first_t) / 1000
    average_step = sampled / (len(pts) - 1)
    threshold = average_step * 1.1
    end_part = to_end if to_end < threshold else average_step / 2
    factor = (sampled + (to_start if to_start < threshold else average_step / 2) + end_part) / sampled
    out = []
    for r, f in zip(result, first):
        if r > 0 and f >= 0 and (to_zero := sampled * (f / r)) < to_start:
            out.append(r * ((sampled + (to_zero if to_zero < threshold else average_step / 2) + end_part) / sampled))
        else:
            out.append(r * factor)
    return tuple(out)


def _add_falls(result: list[float], prev: Sequence[float], cur: Sequence[float], n: int) -> None:
    for i in range(n):
        if cur[i] < prev[i]:  # this bucket's counter reset
            result[i] += prev[i]


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    """Prometheus's bucketQuantile over cumulative ``counts`` at upper ``bounds``; NaN when undefined."""
    return histogram_quantiles((q,), bounds, counts)[0]


def histogram_quantiles(qs: Sequence[float], bounds: Sequence[float], counts: Sequence[float]) -> list[float]:
    """``histogram_quantile`` at each of ``qs``, the buckets sorted, coalesced and made monotonic once."""
    merged = _buckets(bounds, counts)
    return [_bucket_quantile(q, merged) for q in qs]


def _buckets(bounds: Sequence[float], counts: Sequence[float]) -> list[list[float]] | None:
    """(bound, count) sorted by bound, equal bounds coalesced, counts never decreasing; None when no quantile is
    defined (no +Inf bucket, fewer than two buckets, no observations)."""
    pairs = sorted(zip(bounds, counts))
    if not pairs or not math.isinf(pairs[-1][0]):
        return None
    merged: list[list[float]] = []
    for b, c in pairs:  # coalesce buckets with the same bound
        if merged and merged[-1][0] == b:
            merged[-1][1] += c
        else:
            merged.append([b, c])
    top = -math.inf
    for m in merged:  # counts must not decrease with le (float noise, scrape races)
        if m[1] > top:
            top = m[1]
        elif m[1] < top:
            m[1] = top
    if len(merged) < 2 or merged[-1][1] == 0:
        return None
    return merged


def _bucket_quantile(q: float, merged: list[list[float]] | None) -> float:
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if merged is None:
        return math.nan
    observations = merged[-1][1]
    rank = q * observations
    b = next((i for i in range(len(merged) - 1) if merged[i][1] >= rank), len(merged) - 1)
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[b][0], merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return start + (end - start) * (rank / count)


def fraction_le(threshold: float, bounds: Sequence[float], counts: Sequence[float]) -> tuple[float, float] | None:
    """Share of observations <= threshold as far as buckets tell: (at least, at most).

    ``at least`` counts the buckets wholly below the threshold; ``at most`` adds the bucket the
    threshold falls in. They are equal when the threshold is a bucket bound.
    """
    total = counts[-1] if counts else 0
    if not total:
        return None
    low = high = 0.0
    for b, c in zip(bounds, counts):
        if b <= threshold:
            low = c
        high = c
        if b >= threshold:
            break
    return min(low / total, 1.0), min(high / total, 1.0)


def fraction_le_linear(threshold: float, bounds: Sequence[float], counts: Sequence[float]) -> float | None:
    """Share of observations <= threshold with the observations spread evenly within each bucket: the assumption
    ``histogram_quantile`` makes (and Prometheus's ``histogram_fraction`` for native histograms), so this is the
    inverse of ``_bucket_quantile`` on the same buckets. The first bucket starts at 0 (at its bound when that is
    not above 0); a threshold in the +Inf bucket gets the count below it. Lies within ``fraction_le``'s bounds."""
    merged = _buckets(bounds, counts)
    if merged is None:
        return None
    total = merged[-1][1]
    below, start = 0.0, 0.0
    for i, (b, c) in enumerate(merged):
        if threshold < b:
            if math.isinf(b):
                return below / total
            if i == 0 and b <= 0:
                return 0.0
            share = max(0.0, (threshold - start) / (b - start))  # bounds rise strictly once _buckets coalesced them
            return (below + (c - below) * share) / total
        below, start = c, b
    return 1.0
