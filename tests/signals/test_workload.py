"""The workload read from a stored window, and workload files: each expected value worked out beside it."""

from __future__ import annotations

import math

import pytest

from tuner.errors import ConfigError
from tuner.signals.workload import Workload, dump_workload, from_window, parse_workload
from tuner.store.window import EngineWindow, HistPoint, HistSeries, TargetWindow

S = 1000
TOKEN_BOUNDS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, math.inf)


def _counter(per_step, n=13):
    out, total = [], 0.0
    for i in range(n):
        out.append((i * 5 * S, total))
        total += per_step[i % len(per_step)]
    return tuple(out)


def _hist(bucket: int, per_step: float, mean: float, n=13) -> HistSeries:
    """``per_step`` requests each 5 s, all in bucket ``bucket`` (index into TOKEN_BOUNDS), ``mean`` tokens each."""
    pts = []
    for i in range(n):
        count = per_step * i
        cum = tuple(count if j >= bucket else 0.0 for j in range(len(TOKEN_BOUNDS)))
        pts.append(HistPoint(i * 5 * S, cum, mean * count, count))
    return HistSeries(TOKEN_BOUNDS, tuple(pts))


def _window(finished_per_step=(15,), generated_per_step=(3000,), hits=100, config=None) -> TargetWindow:
    series = {
        ("vllm:request_success_total", (("finished_reason", "length"),)): _counter(finished_per_step),
        ("vllm:generation_tokens_total", ()): _counter(generated_per_step),
        ("vllm:prefix_cache_queries_total", ()): _counter([400]),
        ("vllm:prefix_cache_hits_total", ()): _counter([hits]),
    }
    hists = {
        ("vllm:request_prompt_tokens", ()): _hist(5, 15, 100.0),  # (64, 128], 100 tokens each
        ("vllm:request_generation_tokens", ()): _hist(6, 15, 200.0),
    }  # (128, 256], 200 each
    e = EngineWindow(engine="0", model_name="m", series=series, hists=hists, config=config or {})
    return TargetWindow(target="t", backend="vllm", start_ms=0, end_ms=60 * S, engines=(e,), health=None)


def test_lengths_rate_prefix_and_longest_request_from_the_window():
    w = from_window(_window())
    assert (w.input_len, w.output_len) == (100, 200)  # the histograms' sum / count
    assert (w.max_prompt_tokens, w.max_output_tokens) == (128, 256)  # the top bucket used
    assert w.longest == 384
    assert w.rate_rps == pytest.approx(3.0)  # 15 finished per 5 s, nothing in flight at either end
    assert w.prefix_hit_ratio == pytest.approx(0.25) and w.prefix_len == 25  # 100 / 400 hits, x 100 tokens
    # P10 and P90 inside (64, 128]: 70.4 and 121.6 by linear interpolation; (121.6 - 70.4) / (1.6 x 100) = 0.32
    assert w.range_ratio == pytest.approx(0.32)
    assert w.burstiness == 10.0  # the same count every interval: as regular as the scale allows
    assert w.requests == 180 and w.source == "store" and w.window_s == 60


def test_a_shared_prefix_is_bounded_by_the_kv_block_its_hits_come_in():
    """vLLM hits whole KV blocks only. Read from a real store (bench/corpus-drawn4's drawn-790-1): every prompt
    began with the same 86 tokens, vLLM CPU's blocks hold 128, and not one token hit; the prefix reads 0, and what
    the window proves must reach the 86 it cannot see."""
    w = from_window(_window(config={"block_size": "16"}))  # 100 of 400 prompt tokens hit: 25 of each 100-token prompt
    assert w.prefix_len == 25
    assert (w.inferred["prefix_len"].low, w.inferred["prefix_len"].high) == (25, 40)  # 25 hit; 15 more fit a block
    assert "whole blocks of 16 tokens" in w.inferred["prefix_len"].note
    blind = from_window(_window(hits=0, config={"block_size": "128"}))
    assert blind.prefix_len == 0  # replayed as none: a prefix shorter than a block hits exactly as often as none
    assert (blind.inferred["prefix_len"].low, blind.inferred["prefix_len"].high) == (0, 99)  # up to the prompt
    unknown = from_window(_window())  # no cache_config_info seen: no upper bound is proven
    assert (unknown.inferred["prefix_len"].low, unknown.inferred["prefix_len"].high) == (25, None)
    assert "did not report" in unknown.inferred["prefix_len"].note


def test_bursty_arrivals_give_a_gamma_shape_below_one():
    w = from_window(_window(finished_per_step=(0, 30)))
    # per-interval counts alternate 0 and 30: mean 15, variance 15^2 x 12/11 = 245.5; 15 / 245.5 = 0.061 -> 0.1
    assert w.burstiness == 0.1
    w = from_window(_window(finished_per_step=(10, 20)))
    # alternating 10 and 20 over 12 intervals, the stretch's first and last left out (partial, in real traffic):
    # 10 of them, mean 15, variance 25 x 10/9 = 27.8: shape 0.54
    assert w.burstiness == pytest.approx(15 / (25 * 10 / 9), abs=0.001)


def test_the_partial_intervals_at_a_stretch_s_ends_and_drifting_scrapes_are_not_burstiness():
    """Poisson-like traffic read from a real store (bench/tune_corpus.py's rag shape) read as burstiness 0.355
    (95% 0.13-0.69): the interval in which the traffic started held 1 request against ~15. Left out, and each
    interval measured against its own length (scrapes 4.8-5.2 s apart on a loaded host), the same finishes read
    as 0.58, with 1 (Poisson) inside the interval."""
    from tuner.signals.load import Interval
    from tuner.signals.workload import _burstiness, _inner_busy

    counts = [1, 23, 13, 10, 23, 12, 10, 17, 8, 15, 20, 17, 11]  # finished per scrape interval, as stored
    lengths = [5.0, 5.06, 4.95, 5.0, 4.99, 5.05, 4.95, 5.14, 4.86, 5.0, 5.0, 5.21, 4.8]
    ivs = (
        [Interval(5.0, 0, 0, False)]
        + [Interval(t, c, 100.0, True) for t, c in zip(lengths, counts)]
        + [Interval(5.0, 0, 0, False)]
    )
    inner = _inner_busy(ivs)
    assert [iv.finished for iv in inner] == counts[1:-1]  # the stretch's first (1) and last (11) left out
    k, (shape, low, high) = _burstiness(ivs)
    # 11 intervals, 168 requests in 55.21 s (3.043/s): sum of (c - 3.043 t)^2 / (3.043 t) over them = 17.11,
    # / 10 = 1.711 -> shape 0.584; chi-square(10) 2.5% / 97.5% points 3.247 / 20.483 -> shape 0.190..1.197
    rate = 168 / sum(lengths[1:-1])
    disp = sum((c - rate * t) ** 2 / (rate * t) for c, t in zip(counts[1:-1], lengths[1:-1])) / 10
    assert k == 11 and shape == pytest.approx(1 / disp, abs=0.001) and 0.5 < shape < 0.6
    assert low == pytest.approx(3.247 / (10 * disp), rel=0.03) and high == pytest.approx(20.483 / (10 * disp), rel=0.03)
    assert low <= 1.0 <= high  # the client sent Poisson arrivals
    assert _inner_busy([Interval(5, 3, 1, True), Interval(5, 4, 1, True)]) == [
        Interval(5, 3, 1, True),
        Interval(5, 4, 1, True),
    ]


def test_idle_gaps_between_phases_are_not_burstiness():
    # 15 per interval while busy, and idle intervals (nothing finished, generated or in flight) in between: a
    # load that stopped and started again, like the demo's phases. Only the busy intervals count: regular.
    w = from_window(_window(finished_per_step=(15, 15, 0, 0), generated_per_step=(3000, 3000, 0, 0)))
    assert w.burstiness == 10.0
    # counted over every interval it would have read as very bursty: mean 7.5, variance 61.4 -> 0.12
    assert from_window(_window(finished_per_step=(15, 15, 0, 0), generated_per_step=(1, 1, 1, 1))).burstiness < 0.2


def test_the_rate_is_read_over_the_traffic_not_over_idle_ends_of_the_window():
    # 15 arrivals per 5 s (3/s) in intervals 3-8, the window's first and last 15 s idle: a replay read back with a
    # margin, as bench/tune_corpus.py does. Over the whole 60 s that is 1.5/s, and its interval (count +- 1.96 x
    # sqrt(90 / 10), over 60 s) is 1.40-1.60: the rate sent lies far outside it, as it did for every drawn shape.
    idle3 = (0, 0, 0)
    w = from_window(
        _window(finished_per_step=(*idle3, *[15] * 6, *idle3), generated_per_step=(*idle3, *[9] * 6, *idle3))
    )
    rate = w.inferred["rate_rps"]
    # the traffic spans 30 s less anything from none to all of its two edge intervals (it began and ended inside
    # them, somewhere): 20-30 s; the point takes half of each (25 s), the bounds the count's interval over each end
    z = 1.96 * math.sqrt(90 / w.burstiness)
    assert w.rate_rps == pytest.approx(90 / 25)
    assert rate.low == pytest.approx((90 - z) / 30, abs=1e-4) and rate.high == pytest.approx((90 + z) / 20, abs=1e-4)
    assert rate.low <= 3.0 <= rate.high  # the true rate, which filled both edge intervals here: the worst case
    assert "15s before and 15s after without traffic left out" in rate.note
    # busy from end to end (every production window): the whole window, as before
    full = from_window(_window()).inferred["rate_rps"]
    assert full.note.startswith("180 arrivals in 60s of traffic:") and "left out" not in full.note
    # an idle gap inside the traffic is part of its arrivals: only the idle end is left out
    gap = from_window(_window(finished_per_step=(15, 15, 0, 0), generated_per_step=(3000, 3000, 0, 0)))
    assert "0s before and 10s after" in gap.inferred["rate_rps"].note
    # 50 s of traffic, its last busy interval's 5 s counted half
    assert gap.rate_rps == pytest.approx(90 / 47.5, abs=1e-4)


def test_a_saturated_window_says_nothing_of_arrivals_so_poisson_is_assumed():
    win = _window(finished_per_step=(0, 30))  # as bursty as above ...
    e = win.engines[0]
    waiting = {("vllm:num_requests_waiting", ()): tuple((i * 5 * S, 6.0) for i in range(13))}  # ... but queued
    saturated = TargetWindow("t", "vllm", 0, 60 * S, (EngineWindow("0", "m", {**e.series, **waiting}, e.hists),), None)
    assert from_window(saturated).burstiness == 1.0


def test_no_finished_request_means_no_workload():
    e = EngineWindow(engine="0", model_name="m", series={}, hists={})
    assert from_window(TargetWindow("t", "vllm", 0, 60 * S, (e,), None)) is None


def test_a_workload_file_round_trips_and_bad_keys_are_named():
    w = from_window(_window())
    import yaml

    assert parse_workload(yaml.safe_dump(dump_workload(w))) == w
    with pytest.raises(ConfigError, match=r"wl.yaml: output_len: Field required"):
        parse_workload("input_len: 10\n", "wl.yaml")
    with pytest.raises(ConfigError, match=r"wl.yaml: input_lenn: unknown key"):
        parse_workload("input_lenn: 10\noutput_len: 5\n", "wl.yaml")
    with pytest.raises(ConfigError, match=r"wl.yaml: burstiness: Input should be greater than 0"):
        parse_workload("input_len: 10\noutput_len: 5\nburstiness: 0\n", "wl.yaml")
    with pytest.raises(ConfigError, match=r"wl.yaml: prefix_len: 10 must be shorter than input_len"):
        parse_workload("input_len: 10\noutput_len: 5\nprefix_len: 10\n", "wl.yaml")
    with pytest.raises(ConfigError, match=r"wl.yaml: line 2: not valid YAML"):
        parse_workload("input_len: [\n", "wl.yaml")
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_workload("- 1\n", "wl.yaml")
    assert Workload(input_len=10, output_len=5).longest == 15


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        ("input_len: true\noutput_len: 5\n", "input_len", "valid integer"),
        ("input_len: '100'\noutput_len: 5\n", "input_len", "valid integer"),
        ("input_len: 10.5\noutput_len: 5\n", "input_len", "valid integer"),
        ("input_len: 10\noutput_len: 5\nrate_rps: .inf\n", "rate_rps", "finite number"),
        ("input_len: 10\noutput_len: 5\nburstiness: .nan\n", "burstiness", "finite number"),
        ("input_len: 100\noutput_len: 5\nmax_prompt_tokens: 50\n", "max_prompt_tokens", "below input_len (100)"),
        ("input_len: 10\noutput_len: 50\nmax_output_tokens: 20\n", "max_output_tokens", "below output_len (50)"),
    ],
)
def test_a_workload_file_takes_strict_finite_consistent_values(text: str, key: str, says: str) -> None:
    """Issue 39 item 13: `input_len: true` read as 1, `rate_rps: .inf` and a longest prompt below the mean passed."""
    with pytest.raises(ConfigError) as info:
        parse_workload(text, "wl.yaml")
    assert info.value.key == key and says in info.value.reason, info.value
    assert parse_workload("input_len: 10\noutput_len: 5\nrate_rps: 2\nburstiness: 1\n").rate_rps == 2.0


def test_requests_past_the_last_finite_bucket_give_a_longest_request_no_shorter_than_the_mean():
    """All prompts above 1024 tokens (+Inf bucket): the histogram bounds the longest at 1024, below the 3,000 mean."""
    w = _window()
    e = w.engines[0]
    hists = {**e.hists, ("vllm:request_prompt_tokens", ()): _hist(9, 15, 3000.0)}
    got = from_window(TargetWindow("t", "vllm", 0, 60 * S, (EngineWindow("0", "m", e.series, hists),), None))
    assert got is not None and got.input_len == 3000 and got.max_prompt_tokens == 3000


# vLLM 0.32's own bucket edges for request_prompt_tokens / request_generation_tokens (tests/fixtures' expositions)
VLLM_TOKEN_BOUNDS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, math.inf)


def _rag_window(
    *,
    aborted: float = 0.0,
    http_4xx: float = 0.0,
    with_http: bool = True,
    prompts: tuple[dict[int, float], float] = ({9: 613.0}, 752.0),
) -> TargetWindow:
    """The issue's RAG window: 613 prompts of 650-850 tokens (mean 752, all in vLLM's (500, 1000] bucket) and
    outputs of 40-120 (mean 80: (50, 100] and (100, 200]), served at max-model-len 1024. ``prompts``: other prompts,
    as requests per bucket (index into VLLM_TOKEN_BOUNDS) and their mean."""
    n = 13

    def hist(per_bucket: dict[int, float], mean: float) -> HistSeries:
        pts = []
        for i in range(n):
            cum, running = [], 0.0
            for j in range(len(VLLM_TOKEN_BOUNDS)):
                running += per_bucket.get(j, 0.0) * i / (n - 1)
                cum.append(running)
            pts.append(HistPoint(i * 5 * S, tuple(cum), mean * cum[-1], cum[-1]))
        return HistSeries(VLLM_TOKEN_BOUNDS, tuple(pts))

    per_step = 613 / (n - 1)
    series = {
        ("vllm:request_success_total", (("finished_reason", "length"),)): _counter([per_step], n),
        ("vllm:request_success_total", (("finished_reason", "abort"),)): _counter([aborted / (n - 1)], n),
        ("vllm:generation_tokens_total", ()): _counter([per_step * 80], n),
    }
    if with_http:
        series[("http_requests_total", (("handler", "/v1/completions"), ("method", "POST"), ("status", "2xx")))] = (
            _counter([per_step], n)
        )
        series[("http_requests_total", (("handler", "/v1/completions"), ("method", "POST"), ("status", "4xx")))] = (
            _counter([http_4xx / (n - 1)], n)
        )
        series[("http_requests_total", (("handler", "/metrics"), ("method", "GET"), ("status", "4xx")))] = _counter(
            [1.0], n
        )  # not a completion route: says nothing of the requests
    hists = {
        ("vllm:request_prompt_tokens", ()): hist(*prompts),
        ("vllm:request_generation_tokens", ()): hist({6: 200.0, 7: 413.0}, 80.0),
    }
    e = EngineWindow(engine="0", model_name="m", series=series, hists=hists)
    return TargetWindow(target="t", backend="vllm", start_ms=0, end_ms=60 * S, engines=(e,), health=None)


def test_a_window_that_served_every_request_proves_its_max_model_len_holds_them():
    w = from_window(_rag_window(), max_model_len=1024, limit_source="the flags in force")
    # the buckets' edges alone: 1000 + 200 = 1200 > 1024, which pruned the flags in force that had served them all
    assert (w.max_prompt_tokens, w.max_output_tokens) == (1000, 200)
    assert w.max_request_tokens == 1024 and w.longest == 1024
    inf = w.inferred["max_request_tokens"]
    assert (inf.low, inf.high) == (502, 1024)  # some request had a prompt above 500 (and an output)
    assert "capped at max-model-len 1024 (the flags in force)" in inf.note and "all 613 requests" in inf.note
    assert w.inferred["max_prompt_tokens"].high == 1000 and w.inferred["max_output_tokens"].high == 200
    # the flags in force pass feasibility now
    from tuner.tune.space import Hardware, feasible

    assert feasible("vllm", {"max_model_len": 1024}, model=None, hardware=Hardware(), longest=w.longest).ok


@pytest.mark.parametrize(
    "window,why",
    [
        (dict(aborted=3), "3 aborted"),
        (dict(http_4xx=2), "2 http errors"),  # vLLM answers 400 to a prompt longer than max-model-len
    ],
)
def test_a_window_that_turned_requests_away_keeps_the_bucket_edges(window, why):
    w = from_window(_rag_window(**window), max_model_len=1024)
    assert w.max_request_tokens == 1200 and w.longest == 1200
    assert why in w.inferred["max_request_tokens"].note


def test_without_the_limit_in_force_the_bucket_edges_stand_and_missing_evidence_is_named():
    w = from_window(_rag_window())
    assert w.max_request_tokens == 1200 and "unknown" in w.inferred["max_request_tokens"].note
    w = from_window(_rag_window(with_http=False), max_model_len=1024)
    assert w.max_request_tokens == 1024
    assert "not in the store: http_requests_total" in w.inferred["max_request_tokens"].note


def test_each_inferred_value_carries_its_interval():
    w = from_window(_rag_window(), max_model_len=1024)
    # both quantiles inside (500, 1000]: their difference alone allows 0 to (1000 - 500) / (1.6 x 752) = 0.4156; around
    # the exact mean, P90 = 752 x (1 + 0.8r) <= 1000 allows up to 0.412. The true 0.133 lies inside, the point
    # value (uniform within the bucket) is 0.332
    rr = w.inferred["range_ratio"]
    assert (rr.low, rr.high) == (0.0, pytest.approx(0.4122, abs=0.001))  # P90 = 752 x (1 + 0.8r) <= 1000
    assert rr.low <= 0.133 <= rr.high and rr.low <= w.range_ratio <= rr.high
    assert "both in the (500, 1000] token bucket" in rr.note
    assert w.inferred["input_len"].low == w.inferred["input_len"].high == 752  # a mean of sums: exact
    # 613 arrivals in 60 s (10.2/s), every interval the same count: 10 (as regular as the scale allows)
    rate = w.inferred["rate_rps"]
    half = 1.96 * math.sqrt(613 / 10.0) / 60
    assert rate.low == pytest.approx(613 / 60 - half, abs=1e-3) and rate.high == pytest.approx(
        613 / 60 + half, abs=1e-3
    )
    from tuner.signals.workload import describe

    lines = describe(w)
    assert any(line.startswith("range_ratio") and "[0 .. 0.412]" in line for line in lines), lines


def test_the_exact_mean_bounds_the_range_ratio_where_one_bucket_holds_both_quantiles():
    # drawn-5553-2 (bench/corpus-drawn3): 260-token prompts drawn with range 0.05, P10 and P90 both in (200, 500].
    # The quantiles' difference alone allowed 0-0.721 and the value read 0.577 (prompts 110-410); with the mean
    # exact, P10 = 260 x (1 - 0.8r) > 200 holds only for r < (1 - 200/260) / 0.8 = 0.288
    w = from_window(_rag_window(prompts=({8: 613.0}, 260.0)))
    rr = w.inferred["range_ratio"]
    assert (rr.low, rr.high) == (0.0, pytest.approx(0.2885, abs=0.001)) and rr.low <= 0.05 <= rr.high
    assert w.range_ratio == pytest.approx(0.288, abs=0.001)  # the interpolated 0.577, brought inside what fits
    assert "exact mean of 260" in rr.note


def test_the_range_ratio_bounds_hold_the_truth_for_uniform_prompts_and_never_move_the_value_away_from_it():
    """Prompts uniform on mean x [1 - r, 1 + r], as vLLM's random dataset draws them, binned exactly into vLLM's
    buckets: the inferred interval holds the true r, and the value is no further from it than the interpolated
    spread before the bounds (bringing it inside an interval that holds the truth can only move it closer)."""
    import random

    from tuner.signals.promql import histogram_quantile

    rng = random.Random(20261128)
    edges = (0.0, *VLLM_TOKEN_BOUNDS)
    closer = 0
    for _ in range(300):
        mean, r = rng.uniform(8, 900), rng.uniform(0, 0.9)
        lo, hi = mean * (1 - r), mean * (1 + r)
        per = {
            j: 6130 * max(0.0, min(hi, edges[j + 1]) - max(lo, edges[j])) / (hi - lo)
            for j in range(len(VLLM_TOKEN_BOUNDS))
        }
        w = from_window(_rag_window(prompts=(per, mean)))
        rr = w.inferred["range_ratio"]
        assert rr.low - 1e-3 <= r <= rr.high + 1e-3, (mean, r, rr)
        cum = [sum(per.get(k, 0.0) for k in range(j + 1)) for j in range(len(VLLM_TOKEN_BOUNDS))]
        p10, p90 = (histogram_quantile(q, VLLM_TOKEN_BOUNDS, cum) for q in (0.1, 0.9))
        before = min(0.9, max(0.0, (p90 - p10) / (1.6 * mean)))
        assert abs(w.range_ratio - r) <= abs(before - r) + 2e-3, (mean, r, before, w.range_ratio)
        closer += abs(w.range_ratio - r) < abs(before - r) - 0.01
    assert closer >= 30  # and it does move some of them closer (a bound that never binds would pass the rest)


def test_the_burstiness_interval_is_a_chi_square_interval_on_the_dispersion():
    w = from_window(_window(finished_per_step=(10, 20)))
    # 10 inner busy intervals alternating 10 and 20: mean 15, variance 27.78, dispersion 1.852 with 9 degrees of
    # freedom; chi-square(9) 2.5% and 97.5% points 2.700 and 19.023 -> dispersion 0.876..6.173 -> shape 0.162..1.141
    b = w.inferred["burstiness"]
    assert b.low == pytest.approx(1 / 6.173, rel=0.03) and b.high == pytest.approx(1 / 0.876, rel=0.03)
    assert b.low <= w.burstiness <= b.high


def test_each_interval_counts_its_arrivals_as_finishes_plus_the_change_in_flight():
    """A server that queued a burst: 12 arrived in the first 5 s, 3 of them finished there and 9 were still running
    or waiting at its end; 6 finished in the next and 3 more arrived (9 - 6 + 3 = 6 in flight after it). The
    finishes per interval (3, 6) are not the arrivals (12, 3); the arrivals sum to the offered load."""
    from tuner.signals.load import profile

    e = EngineWindow(
        engine="0",
        model_name="m",
        series={
            ("vllm:request_success_total", (("finished_reason", "stop"),)): ((0, 0.0), (5 * S, 3.0), (10 * S, 9.0)),
            ("vllm:generation_tokens_total", ()): ((0, 0.0), (5 * S, 50.0), (10 * S, 120.0)),
            ("vllm:num_requests_running", ()): ((0, 0.0), (5 * S, 4.0), (10 * S, 4.0)),
            ("vllm:num_requests_waiting", ()): ((0, 0.0), (5 * S, 5.0), (10 * S, 2.0)),
        },
        hists={},
    )
    p = profile(TargetWindow("t", "vllm", 0, 10 * S, (e,), None))
    assert [iv.finished for iv in p.intervals] == [3.0, 6.0]
    assert [iv.arrived for iv in p.intervals] == [12.0, 3.0]
    assert math.fsum(iv.arrived for iv in p.intervals) / 10 == pytest.approx(p.offered_rps)
    # llama-server counts no requests: its intervals say nothing of arrivals, whatever its gauges did
    llama_series = {
        ("llamacpp:tokens_predicted_total", ()): ((0, 0.0), (5 * S, 50.0), (10 * S, 120.0)),
        ("llamacpp:requests_processing", ()): ((0, 0.0), (5 * S, 4.0), (10 * S, 4.0)),
    }
    llama = profile(TargetWindow("t", "llamacpp", 0, 10 * S, (EngineWindow("0", "m", llama_series, {}),), None))
    assert len(llama.intervals) == 2 and all(iv.arrived is None for iv in llama.intervals)


def test_hits_of_less_than_a_block_a_prompt_are_no_prefix_every_prompt_shares():
    """Read from real stores (bench/corpus-drawn8): three shapes sent with no shared prefix hit 0.6-7% of their
    prompt tokens in vLLM's cache (128-token blocks), 2-33 tokens a prompt: vLLM's random dataset starts each prompt
    at a random token of the tiny model's 4,096, so some prompts begin alike. A prefix every prompt shares hits a
    whole block each or none; none hits 25 tokens a prompt. Replayed as no prefix, with the block's bound."""
    w = from_window(_window(hits=100, config={"block_size": "128"}))  # 25 of each 100-token prompt hit
    assert w.prefix_hit_ratio == pytest.approx(0.25)  # the hits themselves, as measured
    assert w.prefix_len == 0
    b = w.inferred["prefix_len"]
    assert (b.low, b.high) == (0, 99)  # up to the prompt (a block would be 127)
    assert "less than one block of 128" in b.note and "Replayed as none" in b.note
    # a whole block a prompt is a prefix every prompt shares, as before
    whole = from_window(_window(hits=100, config={"block_size": "16"}))
    assert whole.prefix_len == 25
