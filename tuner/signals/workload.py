"""The workload a server really served, as the load a benchmark should replay. Pure.

From one stored window of a vLLM target (its request histograms and counters, the same deltas the signals use):

  input_len, output_len   mean prompt and generated tokens per finished request (the histograms' sum / count)
  range_ratio             spread of prompt lengths as vLLM's random dataset draws them, uniform on
                          [len x (1 - r), len x (1 + r)]: a uniform's P90 - P10 is 0.8 x its width, so
                          r = (P90 - P10) / (1.6 x mean), from the prompt histogram, within [0, 0.9]
  rate_rps                offered arrivals per second (signals/load.py: finished + the change in in-flight)
  burstiness              the gamma shape of inter-arrival times (vLLM bench's --burstiness: 1 is Poisson, below
                          1 burstier). Counts of a renewal process over long intervals have an index of dispersion
                          (variance / mean) of CV^2 = 1 / shape, so shape = mean / variance of the requests finished
                          per busy scrape interval (arrivals are not counted apart from finishes; intervals in which
                          nothing ran, waited or finished are gaps in the traffic, left out), within [0.1, 10].
                          When the window is saturated (signals/load.py), requests finish as batches complete, not
                          as they arrive: then 1 (Poisson), since finishes say nothing of the arrivals
  prefix_hit_ratio        prefix-cache hits / queries (tokens)
  prefix_len              shared prompt prefix the replay should carry: prefix_hit_ratio x input_len
  max_prompt_tokens, max_output_tokens   the longest request seen: the upper bound of the highest bucket used
                          (max-model-len must never fall below their sum)

The same fields load from a YAML file (``tuner workload -o``, or written by hand); ``parse_workload`` rejects an
unknown or bad key by name, as the config does.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.config import YamlTextError, load_yaml
from tuner.errors import ConfigError
from tuner.signals.load import _deltas, _hist_increase, profile
from tuner.signals.promql import histogram_quantile
from tuner.store.window import EngineWindow, TargetWindow

__all__ = ["Workload", "from_window", "parse_workload", "dump_workload"]

_PROMPT, _GEN = "vllm:request_prompt_tokens", "vllm:request_generation_tokens"


class Workload(BaseModel):
    """What a benchmark replays: lengths in tokens, the arrival rate and its burstiness."""

    # strict: `input_len: true` or `"100"` is refused, not read as 1 or 100; no NaN or infinity anywhere
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    input_len: int = Field(ge=1, le=1_000_000)
    output_len: int = Field(ge=1, le=1_000_000)
    range_ratio: float = Field(0.0, ge=0, lt=1)
    prefix_len: int = Field(0, ge=0, le=1_000_000)
    rate_rps: float | None = Field(None, gt=0)  # offered load seen; the capacity search starts there
    burstiness: float = Field(1.0, gt=0, le=100)
    prefix_hit_ratio: float | None = Field(None, ge=0, le=1)
    max_prompt_tokens: int | None = Field(None, ge=1)
    max_output_tokens: int | None = Field(None, ge=1)
    requests: int | None = Field(None, ge=0)  # finished requests the profile was drawn from
    source: Literal["store", "file", "default"] = "file"
    window_s: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _prefix(self) -> "Workload":
        if self.prefix_len >= self.input_len:
            raise ValueError(f"prefix_len: {self.prefix_len} must be shorter than input_len ({self.input_len})")
        # the longest request is at least as long as the mean one
        for top, mean in (("max_prompt_tokens", "input_len"), ("max_output_tokens", "output_len")):
            if getattr(self, top) is not None and getattr(self, top) < getattr(self, mean):
                raise ValueError(f"{top}: {getattr(self, top)} is below {mean} ({getattr(self, mean)}); the longest "
                                 f"request cannot be shorter than the mean one")
        return self

    @property
    def longest(self) -> int:
        """Prompt + output tokens of the longest request the replay must fit (max-model-len's floor)."""
        top_in = self.max_prompt_tokens or math.ceil(self.input_len * (1 + self.range_ratio))
        top_out = self.max_output_tokens or math.ceil(self.output_len * (1 + self.range_ratio))
        return top_in + top_out


def _sum_hist(engines: list[EngineWindow], metric: str) -> tuple[tuple[float, ...], list[float], float, float] | None:
    """(bounds, cumulative counts, sum, count) of a histogram's increase over the window, summed over engines."""
    bounds: tuple[float, ...] = ()
    cum: list[float] | None = None
    total = count = 0.0
    for e in engines:
        h = e.hists.get((metric, ()))
        inc = _hist_increase(h) if h is not None else None
        if h is None or inc is None:
            continue
        first, last = h.points[0], h.points[-1]
        reset = last.count < first.count
        if cum is None:
            bounds, cum = h.bounds, list(inc)
        elif h.bounds == bounds:
            cum = [a + b for a, b in zip(cum, inc)]
        else:
            continue
        total += last.sum if reset else last.sum - first.sum
        count += last.count if reset else last.count - first.count
    return (bounds, cum, total, count) if cum is not None and count > 0 else None


def _top_bound(bounds: tuple[float, ...], cum: list[float]) -> int | None:
    """Upper bound of the highest bucket with observations (the one below +Inf when that is where they are)."""
    for i in range(len(cum) - 1, -1, -1):
        if cum[i] > (cum[i - 1] if i else 0.0):
            b = bounds[i] if math.isfinite(bounds[i]) else (bounds[i - 1] if i else None)
            return int(b) if b else None
    return None


def _at_least(top: int | None, mean: int) -> int | None:
    """The longest request's bound, never below the mean (requests past the last finite bucket: that bound is
    all a histogram says, and it can be below their mean)."""
    return None if top is None else max(top, mean)


def _counter_increase(e: EngineWindow, metric: str) -> float:
    return math.fsum(math.fsum(_deltas([v for _, v in pts])) for (name, _), pts in e.series.items()
                     if name == metric and len(pts) >= 2)


def from_window(window: TargetWindow) -> Workload | None:
    """The workload of a vLLM window; None when it finished no request (nothing to replay)."""
    engines = [e for e in window.engines if e.series or e.hists]
    prompt, gen = _sum_hist(engines, _PROMPT), _sum_hist(engines, _GEN)
    if prompt is None or gen is None:
        return None
    p_bounds, p_cum, p_sum, p_count = prompt
    g_bounds, g_cum, g_sum, g_count = gen
    input_len = max(1, round(p_sum / p_count))
    output_len = max(1, round(g_sum / g_count))
    p10, p90 = histogram_quantile(0.1, p_bounds, p_cum), histogram_quantile(0.9, p_bounds, p_cum)
    spread = (p90 - p10) / (1.6 * input_len) if math.isfinite(p10) and math.isfinite(p90) else 0.0
    range_ratio = round(min(0.9, max(0.0, spread)), 3)

    load = profile(window)
    rate = load.offered_rps if load is not None and load.offered_rps else None
    burstiness = 1.0
    if load is not None and not load.saturated:  # a saturated server's finishes follow its batches, not arrivals
        arrivals = [iv.finished for iv in load.intervals if iv.busy]  # idle gaps are no rate, not burstiness
        if len(arrivals) >= 4:
            mean = math.fsum(arrivals) / len(arrivals)
            var = math.fsum((a - mean) ** 2 for a in arrivals) / (len(arrivals) - 1)
            if mean > 0:
                burstiness = round(min(10.0, max(0.1, mean / var)), 3) if var > 0 else 10.0

    hits = math.fsum(_counter_increase(e, "vllm:prefix_cache_hits_total") for e in engines)
    queries = math.fsum(_counter_increase(e, "vllm:prefix_cache_queries_total") for e in engines)
    hit_ratio = round(hits / queries, 4) if queries > 0 else None
    prefix_len = min(input_len - 1, round((hit_ratio or 0.0) * input_len))
    return Workload(
        input_len=input_len, output_len=output_len, range_ratio=range_ratio, prefix_len=prefix_len,
        rate_rps=round(rate, 4) if rate else None, burstiness=burstiness, prefix_hit_ratio=hit_ratio,
        max_prompt_tokens=_at_least(_top_bound(p_bounds, p_cum), input_len),
        max_output_tokens=_at_least(_top_bound(g_bounds, g_cum), output_len),
        requests=int(p_count), source="store", window_s=round((window.end_ms - window.start_ms) / 1000, 3))


def parse_workload(text: str, path: str = "<workload>") -> Workload:
    """A workload file's YAML; any problem is a ConfigError naming ``path`` and the key."""
    try:
        data = load_yaml(text) if text.strip() else None
    except YamlTextError as exc:
        raise ConfigError(path, f"line {exc.line}" if exc.line else "", f"not valid YAML: {exc.problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(path, "", "expected a mapping of workload keys (input_len, output_len, ...; "
                                    "see docs/tune.md, 'Workload files')")
    try:
        return Workload.model_validate(data)
    except ValidationError as exc:
        err = next((e for e in exc.errors() if e["type"] == "extra_forbidden"), exc.errors()[0])
        msg = err["msg"].removeprefix("Value error, ")
        key = ".".join(str(p) for p in err["loc"])
        if not key and ": " in msg:
            key, _, msg = msg.partition(": ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (see docs/tune.md, 'Workload files')"
        raise ConfigError(path, key, msg) from None


def dump_workload(w: Workload) -> dict[str, Any]:
    """The file form: every field, None left out."""
    return {k: v for k, v in w.model_dump().items() if v is not None}
