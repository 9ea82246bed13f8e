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


def _window(finished_per_step=(15,), generated_per_step=(3000,)) -> TargetWindow:
    series = {("vllm:request_success_total", (("finished_reason", "length"),)): _counter(finished_per_step),
              ("vllm:generation_tokens_total", ()): _counter(generated_per_step),
              ("vllm:prefix_cache_queries_total", ()): _counter([400]),
              ("vllm:prefix_cache_hits_total", ()): _counter([100])}
    hists = {("vllm:request_prompt_tokens", ()): _hist(5, 15, 100.0),  # (64, 128], 100 tokens each
             ("vllm:request_generation_tokens", ()): _hist(6, 15, 200.0)}  # (128, 256], 200 each
    e = EngineWindow(engine="0", model_name="m", series=series, hists=hists)
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


def test_bursty_arrivals_give_a_gamma_shape_below_one():
    w = from_window(_window(finished_per_step=(0, 30)))
    # per-interval counts alternate 0 and 30: mean 15, variance 15^2 x 12/11 = 245.5; 15 / 245.5 = 0.061 -> 0.1
    assert w.burstiness == 0.1
    w = from_window(_window(finished_per_step=(10, 20)))
    # alternating 10 and 20: mean 15, variance 25 x 12/11 = 27.3: shape 0.55
    assert w.burstiness == pytest.approx(15 / (25 * 12 / 11), abs=0.001)


def test_idle_gaps_between_phases_are_not_burstiness():
    # 15 per interval while busy, and idle intervals (nothing finished, generated or in flight) in between: a
    # load that stopped and started again, like the demo's phases. Only the busy intervals count: regular.
    w = from_window(_window(finished_per_step=(15, 15, 0, 0), generated_per_step=(3000, 3000, 0, 0)))
    assert w.burstiness == 10.0
    # counted over every interval it would have read as very bursty: mean 7.5, variance 61.4 -> 0.12
    assert from_window(_window(finished_per_step=(15, 15, 0, 0), generated_per_step=(1, 1, 1, 1))).burstiness < 0.2


def test_a_saturated_window_says_nothing_of_arrivals_so_poisson_is_assumed():
    win = _window(finished_per_step=(0, 30))  # as bursty as above ...
    e = win.engines[0]
    waiting = {("vllm:num_requests_waiting", ()): tuple((i * 5 * S, 6.0) for i in range(13))}  # ... but queued
    saturated = TargetWindow("t", "vllm", 0, 60 * S, (EngineWindow("0", "m", {**e.series, **waiting}, e.hists),),
                             None)
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


@pytest.mark.parametrize(("text", "key", "says"), [
    ("input_len: true\noutput_len: 5\n", "input_len", "valid integer"),
    ("input_len: '100'\noutput_len: 5\n", "input_len", "valid integer"),
    ("input_len: 10.5\noutput_len: 5\n", "input_len", "valid integer"),
    ("input_len: 10\noutput_len: 5\nrate_rps: .inf\n", "rate_rps", "finite number"),
    ("input_len: 10\noutput_len: 5\nburstiness: .nan\n", "burstiness", "finite number"),
    ("input_len: 100\noutput_len: 5\nmax_prompt_tokens: 50\n", "max_prompt_tokens", "below input_len (100)"),
    ("input_len: 10\noutput_len: 50\nmax_output_tokens: 20\n", "max_output_tokens", "below output_len (50)"),
])
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
