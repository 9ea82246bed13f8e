"""tuner's PromQL arithmetic against Prometheus's own engine (promtool 2.42) on the same samples."""

from __future__ import annotations

import itertools
import math
import random
import re
import subprocess

import pytest
import yaml

from tests.conftest import require_tool
from tuner.signals.promql import fraction_le, histogram_quantile, increase, rate

M = 60_000  # one minute in ms


def _load(start_value: float, step: float, n: int, every_ms: int = 5 * M) -> list[tuple[int, float]]:
    return [(i * every_ms, start_value + step * i) for i in range(n + 1)]


class TestIncrease:
    """Cases from Prometheus's promql/testdata/functions.test (load 5m; eval at 50m over [50m])."""

    def test_plain_counter(self):
        # http_requests{path="/foo"} 0+10x10: 0..100 over 50m, samples on both range ends: no extrapolation.
        assert increase(_load(0, 10, 10), 0, 50 * M) == 100

    def test_counter_reset_counts_the_value_reached(self):
        # /bar 0+10x5 0+10x5: 0..50, reset, 0..40 inside [0, 50m]: 50 + 40 = 90.
        pts = _load(0, 10, 5) + [(30 * M + i * 5 * M, 10.0 * i) for i in range(5)]
        assert increase(pts, 0, 50 * M) == 90

    def test_zero_point_clamp(self):
        # Starts at 10 with slope 10/5m: extrapolating 0 s to the start changes nothing: 100.
        assert increase(_load(10, 10, 10), 0, 50 * M) == 100

    def test_extrapolates_to_range_ends(self):
        # Samples at 5m..45m (80 increase over 40m), range [0, 50m]: each gap 5m < 1.1 * 5m, so
        # extrapolate 40m -> 50m; zero point: 40m * 10/80 = 5m, not shorter than the gap: 80 * 50/40 = 100.
        pts = [(t, v) for t, v in _load(10, 10, 10) if 5 * M <= t <= 45 * M]
        assert increase(pts, 0, 50 * M) == pytest.approx(100)

    def test_far_boundary_extrapolates_half_a_step(self):
        # Samples 0..20m, range end 50m is far (30m > 1.1 * 5m): add half a step: 40 * 22.5/20.
        pts = _load(0, 10, 4)
        assert increase(pts, 0, 50 * M) == pytest.approx(40 * 22.5 / 20)

    def test_needs_two_points(self):
        assert increase([(0, 1.0)], 0, M) is None
        assert rate([], 0, M) is None

    def test_rate_is_increase_per_second_of_range(self):
        assert rate(_load(0, 10, 10), 0, 50 * M) == pytest.approx(100 / 3000)


class TestHistogramQuantile:
    bounds = (0.1, 0.5, 1.0, math.inf)

    def test_interpolates_inside_bucket(self):
        # 100 observations: 20 <= 0.1, 60 <= 0.5, 90 <= 1. P50 rank 50 falls in (0.1, 0.5]:
        # 0.1 + 0.4 * (50 - 20) / (60 - 20) = 0.4.
        assert histogram_quantile(0.5, self.bounds, (20, 60, 90, 100)) == pytest.approx(0.4)

    def test_rank_in_inf_bucket_returns_highest_finite_bound(self):
        assert histogram_quantile(0.99, self.bounds, (20, 60, 90, 100)) == 1.0

    def test_lowest_bucket_starts_at_zero(self):
        # rank 10 of 20 in [0, 0.1]: 0.05.
        assert histogram_quantile(0.1, self.bounds, (20, 60, 90, 100)) == pytest.approx(0.05)

    def test_undefined_cases_are_nan(self):
        assert math.isnan(histogram_quantile(0.5, self.bounds, (0, 0, 0, 0)))
        assert math.isnan(histogram_quantile(0.5, (0.1, 0.5), (1, 2)))  # no +Inf bucket
        assert histogram_quantile(-1, self.bounds, (1, 2, 3, 4)) == -math.inf
        assert histogram_quantile(2, self.bounds, (1, 2, 3, 4)) == math.inf

    def test_non_monotonic_counts_are_fixed_up(self):
        # Counts 20, 60, 55, 70, 100: the 55 is raised to 60. P65 (rank 65) lands in (1, 2]:
        # 1 + 1 * (65 - 60) / (70 - 60) = 1.5; without the fix-up it would be 1 + 10/15.
        bounds = (0.1, 0.5, 1.0, 2.0, math.inf)
        assert histogram_quantile(0.65, bounds, (20, 60, 55, 70, 100)) == pytest.approx(1.5)

    def test_fraction_le_bounds(self):
        assert fraction_le(0.5, self.bounds, (20, 60, 90, 100)) == (0.6, 0.6)  # on a bound: exact
        assert fraction_le(0.7, self.bounds, (20, 60, 90, 100)) == (0.6, 0.9)  # between bounds
        assert fraction_le(1.0, self.bounds, (0, 0, 0, 0)) is None

    def test_fraction_le_linear_is_histogram_quantiles_inverse(self):
        """The share within a budget, the observations spread evenly in each bucket: what histogram_quantile
        assumes, so at the quantile it gives back the rank, and it lies within fraction_le's bounds."""
        from tuner.signals.promql import fraction_le_linear

        counts = (20, 60, 90, 100)
        assert fraction_le_linear(0.7, self.bounds, counts) == pytest.approx(0.6 + 0.3 * 0.2 / 0.5)
        assert fraction_le_linear(0.5, self.bounds, counts) == pytest.approx(0.6)  # on a bound: exact
        assert fraction_le_linear(0.05, self.bounds, counts) == pytest.approx(0.1)  # the first bucket from 0
        assert fraction_le_linear(5.0, self.bounds, counts) == pytest.approx(0.9)  # in +Inf: the count below it
        assert fraction_le_linear(-1.0, self.bounds, counts) == 0.0
        assert fraction_le_linear(1.0, self.bounds, (0, 0, 0, 0)) is None
        rng = random.Random(7)
        for _ in range(300):
            bounds = tuple(sorted(rng.sample([0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0], 5))) + (math.inf,)
            raw = [rng.choice([0, 0, 1, 3, 10]) for _ in bounds]
            cum = tuple(itertools.accumulate(raw))
            if not cum[-1]:
                continue
            q = rng.uniform(0.01, 0.99)
            x = histogram_quantile(q, bounds, cum)
            lo, hi = fraction_le(x, bounds, cum)  # type: ignore[misc]
            got = fraction_le_linear(x, bounds, cum)
            assert got is not None and lo - 1e-9 <= got <= hi + 1e-9
            if x < bounds[-2] and (x > 0 or cum[0] == 0):  # inside a finite bucket: the rank again
                assert got == pytest.approx(q, abs=1e-9), (bounds, cum, q, x)


# ---- the same samples through promtool -----------------------------------------------------------


def _scenarios(seed: int, n: int):
    """Random counters (with resets and gaps) and histograms, plus windows and eval times."""
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        steps = rng.randint(6, 40)
        step_s = rng.choice([1, 2, 5, 15])
        # Counter: random increments, a reset now and then, some missing scrapes.
        values, v = [], rng.uniform(0, 50)
        for _ in range(steps):
            v = rng.uniform(0, 3) if rng.random() < 0.08 else v + rng.choice([0, rng.uniform(0, 20)])
            values.append(None if rng.random() < 0.1 else round(v, 3))
        # Histogram: 5 buckets, cumulative across le, all reset together sometimes.
        bounds = (0.05, 0.25, 1.0, 4.0, math.inf)
        per_bucket = [[] for _ in bounds]
        cum = [0.0] * len(bounds)
        for _ in range(steps):
            if rng.random() < 0.05:
                cum = [0.0] * len(bounds)
            obs = [rng.randint(0, 6) for _ in bounds]
            running = 0.0
            for j, o in enumerate(obs):
                running += o
                cum[j] += running
            for j in range(len(bounds)):
                per_bucket[j].append(cum[j])
        eval_s = rng.randint(step_s * 2, step_s * steps)
        range_s = rng.randint(step_s * 2, step_s * steps)
        q = rng.choice([0.5, 0.9, 0.95, 0.99])
        cases.append(
            dict(
                name=f"s{i}",
                step_s=step_s,
                counter=values,
                bounds=bounds,
                buckets=per_bucket,
                eval_s=eval_s,
                range_s=range_s,
                q=q,
            )
        )
    return cases


def _points(values, step_s):
    return [(i * step_s * 1000, v) for i, v in enumerate(values) if v is not None]


def _window(points, eval_s, range_s):
    lo, hi = (eval_s - range_s) * 1000, eval_s * 1000
    return [(t, v) for t, v in points if lo <= t <= hi], lo, hi


def _tuner_values(case):
    pts, lo, hi = _window(_points(case["counter"], case["step_s"]), case["eval_s"], case["range_s"])
    inc = increase(pts, lo, hi)
    bucket_inc = []
    for series in case["buckets"]:
        bpts, lo, hi = _window(_points(series, case["step_s"]), case["eval_s"], case["range_s"])
        bucket_inc.append(increase(bpts, lo, hi))
    quant = None if None in bucket_inc else histogram_quantile(case["q"], case["bounds"], bucket_inc)
    return inc, quant


def _series_text(values):
    return " ".join("_" if v is None else repr(float(v)) for v in values)


def test_increase_and_quantile_equal_promtool(tmp_path):
    """Each scenario's increase() and histogram_quantile() must be what Prometheus 2.42 computes."""
    promtool = require_tool("promtool")
    cases = _scenarios(seed=20261121, n=60)
    groups, expected = [], {}
    for c in cases:
        inc, quant = _tuner_values(c)
        series = [{"series": f'c{{case="{c["name"]}"}}', "values": _series_text(c["counter"])}]
        for b, vals in zip(c["bounds"], c["buckets"]):
            le = "+Inf" if math.isinf(b) else repr(b)
            series.append({"series": f'h_bucket{{case="{c["name"]}",le="{le}"}}', "values": _series_text(vals)})
        tests = []
        for expr, value in (
            (f'increase(c{{case="{c["name"]}"}}[{c["range_s"]}s])', inc),
            (f'histogram_quantile({c["q"]}, increase(h_bucket{{case="{c["name"]}"}}[{c["range_s"]}s]))', quant),
        ):
            exp = [] if value is None or math.isnan(value) else [{"labels": f'{{case="{c["name"]}"}}', "value": value}]
            tests.append({"expr": expr, "eval_time": f"{c['eval_s']}s", "exp_samples": exp})
            expected[expr] = value
        groups.append({"interval": f"{c['step_s']}s", "input_series": series, "promql_expr_test": tests})
    path = tmp_path / "promql_test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1s", "tests": groups}))
    proc = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    if proc.returncode == 0:
        return  # every value matched Prometheus exactly
    # promtool compares floats exactly; accept differences of float rounding only (relative 1e-9).
    out = proc.stdout + proc.stderr
    failures = re.findall(r'expr: "(.+?)", time: .*?\n\s+exp: (.*?)\n\s+got: (.*?)\n', out, re.S)
    assert failures, out
    for expr, _exp, got in failures:
        expr = expr.replace('\\"', '"')
        ours = expected[expr]
        m = re.search(r"\}\s+(\S+)$", got.strip())
        assert m, f"{expr}: Prometheus returned {got!r}, tuner {ours!r}"
        theirs = float(m.group(1))
        assert ours is not None and math.isclose(ours, theirs, rel_tol=1e-9), f"{expr}: tuner {ours} != {theirs}"


def _each_bucket(hist, lo, hi):
    """The definition: every bucket its own counter, through ``increase``."""
    out = []
    for i in range(len(hist.bounds)):
        inc = increase([(p.ts_ms, p.counts[i]) for p in hist.points], lo, hi)
        if inc is None:
            return None
        out.append(inc)
    return tuple(out)


def test_bucket_increase_in_one_pass_equals_each_bucket_as_its_own_counter():
    import random

    from tuner.signals.promql import bucket_increase
    from tuner.store.window import HistPoint, HistSeries

    rng = random.Random(7)
    bounds = (0.1, 0.5, 1.0, 5.0, math.inf)
    resets = 0
    for case in range(600):
        n = rng.choice([1, 2, 3, 12, 60])
        counts = [0.0] * len(bounds)
        points = []
        ts = 1_000_000 + rng.randint(0, 4000)
        for _ in range(n):
            r = rng.random()
            if r < 0.05:  # a restart: every bucket from 0 again
                counts = [0.0] * len(bounds)
            elif r < 0.08:  # one bucket falls alone (total still rising): a per-bucket reset
                k = rng.randrange(len(bounds) - 1)
                counts[k] = max(0.0, counts[k] - rng.randint(1, 5))
            elif r < 0.09:
                counts = [rng.choice([-1.0, -0.0, math.nan, math.inf]) for _ in bounds]
            else:
                add = [rng.randint(0, 3) for _ in bounds]
                counts = [c + sum(add[: i + 1]) for i, c in enumerate(counts)]
            points.append(HistPoint(ts, tuple(counts), 0.0, counts[-1]))
            ts += rng.choice([1000, 5000, 5000, 15000])
        hist = HistSeries(bounds, tuple(points))
        lo = points[0].ts_ms - rng.choice([0, 2000, 30000])
        hi = points[-1].ts_ms + rng.choice([0, 2000, 30000])
        want, got = _each_bucket(hist, lo, hi), bucket_increase(hist, lo, hi)
        resets += any(b < a for x, y in zip(points, points[1:]) for a, b in zip(x.counts, y.counts))
        assert (want is None) == (got is None), case
        if want is not None:  # bit for bit, NaN where NaN, the sign of zero too
            assert [repr(v) for v in got] == [repr(v) for v in want], case
    assert resets > 50  # the corpus holds resets of both kinds
