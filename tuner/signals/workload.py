"""The workload a server really served, as the load a benchmark should replay. Pure.

From one stored window of a vLLM target (its request histograms and counters, the same deltas the signals use):

  input_len, output_len   mean prompt and generated tokens per finished request (the histograms' sum / count)
  range_ratio             spread of prompt lengths as vLLM's random dataset draws them, uniform on
                          [len x (1 - r), len x (1 + r)]: a uniform's P90 - P10 is 0.8 x its width, so
                          r = (P90 - P10) / (1.6 x mean), from the prompt histogram, within [0, 0.9] and within
                          what the exact mean allows: P10 = mean x (1 - 0.8r) and P90 = mean x (1 + 0.8r) must each
                          lie in their bucket
  rate_rps                offered arrivals per second (signals/load.py: finished + the change in in-flight) over
                          the traffic: the window less its idle scrape intervals at either end (``_rate``)
  burstiness              the gamma shape of inter-arrival times (vLLM bench's --burstiness: 1 is Poisson, below
                          1 burstier). Counts of a renewal process over long intervals have an index of dispersion
                          (variance / mean) of CV^2 = 1 / shape, so shape = mean / variance of the requests finished
                          per busy scrape interval (arrivals are not counted apart from finishes; intervals in which
                          nothing ran, waited or finished are gaps in the traffic, left out), within [0.1, 10].
                          When the window is saturated (signals/load.py), requests finish as batches complete, not
                          as they arrive: then 1 (Poisson), since finishes say nothing of the arrivals
  prefix_hit_ratio        prefix-cache hits / queries (tokens)
  prefix_len              shared prompt prefix the replay should carry: prefix_hit_ratio x input_len (hits come in
                          whole KV blocks: a prefix every prompt shares is up to a block longer); 0 where that is
                          less than one block (no prefix every prompt shares hits that little: some prompts shared
                          blocks with others)
  max_prompt_tokens, max_output_tokens   the longest prompt and output seen: the upper bound of the highest
                          bucket used (the histograms hold nothing finer)
  max_request_tokens      prompt + output of the longest request: their sum, capped at the max-model-len in force
                          when the window proves that limit held every request: vLLM finished every request it took
                          (no finished_reason abort or error) and turned none away (no admission rejection, no
                          4xx/5xx answer on its /v1/ routes, where the store has them). A server that served
                          everything at max-model-len 1024 holds every request in 1024 tokens, whatever the
                          buckets' edges (1000 + 200) say; the flags in force are never pruned for a limit they served.

Each inferred value comes with what the window proves about it (``inferred``: the field -> low, high and how it
was read): the means are exact, a range ratio read from two quantiles inside one wide bucket is not (P10 and P90
both in (500, 1000] with a mean of 752: anything from 0 to 0.412 fits), the rate is a count over a window (a
Poisson interval widened by the burstiness), the burstiness a variance over few intervals (a chi-square interval),
the longest request a bucket edge. ``tuner workload`` prints them; a replay uses the values, the bounds say how far
to trust them.

The same fields load from a YAML file (``tuner workload -o``, or written by hand); ``parse_workload`` rejects an
unknown or bad key by name, as the config does.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.backends import kv_block_size
from tuner.config import YamlTextError, load_yaml
from tuner.errors import ConfigError
from tuner.names import (
    VLLM_ADMISSION_REJECTIONS_TOTAL,
    VLLM_PREFIX_CACHE_HITS_TOTAL,
    VLLM_PREFIX_CACHE_QUERIES_TOTAL,
    VLLM_REQUEST_GENERATION_TOKENS,
    VLLM_REQUEST_PROMPT_TOKENS,
    VLLM_REQUEST_SUCCESS_TOTAL,
)
from tuner.signals.load import deltas, hist_increase, profile
from tuner.signals.promql import histogram_quantile
from tuner.store.window import EngineWindow, TargetWindow

__all__ = ["Workload", "Inferred", "from_window", "parse_workload", "dump_workload", "describe"]

_PROMPT, _GEN = VLLM_REQUEST_PROMPT_TOKENS, VLLM_REQUEST_GENERATION_TOKENS


class Inferred(BaseModel):
    """What the window proves about one inferred value: it lies in [low, high] (None: unbounded that side)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    low: int | float | None = None
    high: int | float | None = None
    note: str = ""


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
    max_request_tokens: int | None = Field(None, ge=2)  # prompt + output of the longest request
    requests: int | None = Field(None, ge=0)  # finished requests the profile was drawn from
    source: Literal["store", "file", "default"] = "file"
    window_s: float | None = Field(None, gt=0)
    inferred: dict[str, Inferred] | None = None  # how sure each inferred value is (from the store only)

    @model_validator(mode="after")
    def _prefix(self) -> Workload:
        if self.prefix_len >= self.input_len:
            raise ValueError(f"prefix_len: {self.prefix_len} must be shorter than input_len ({self.input_len})")
        # the longest request is at least as long as the mean one
        for top, mean in (("max_prompt_tokens", "input_len"), ("max_output_tokens", "output_len")):
            if getattr(self, top) is not None and getattr(self, top) < getattr(self, mean):
                raise ValueError(
                    f"{top}: {getattr(self, top)} is below {mean} ({getattr(self, mean)}); the longest "
                    f"request cannot be shorter than the mean one"
                )
        return self

    @property
    def longest(self) -> int:
        """Prompt + output tokens of the longest request the replay must fit (max-model-len's floor)."""
        top_in = self.max_prompt_tokens or math.ceil(self.input_len * (1 + self.range_ratio))
        top_out = self.max_output_tokens or math.ceil(self.output_len * (1 + self.range_ratio))
        return min(top_in + top_out, self.max_request_tokens or top_in + top_out)


def _sum_hist(engines: list[EngineWindow], metric: str) -> tuple[tuple[float, ...], list[float], float, float] | None:
    """(bounds, cumulative counts, sum, count) of a histogram's increase over the window, summed over engines."""
    bounds: tuple[float, ...] = ()
    cum: list[float] | None = None
    total = count = 0.0
    for e in engines:
        h = e.hists.get((metric, ()))
        inc = hist_increase(h) if h is not None else None
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


def _top_bucket(bounds: tuple[float, ...], cum: list[float]) -> tuple[int, int | None] | None:
    """(lower edge, upper edge) of the highest bucket with observations; upper None when that is +Inf (then the
    value is the last finite bound, as before: the histogram says no more)."""
    for i in range(len(cum) - 1, -1, -1):
        if cum[i] > (cum[i - 1] if i else 0.0):
            lower = int(bounds[i - 1]) if i and math.isfinite(bounds[i - 1]) else 0
            return lower, int(bounds[i]) if math.isfinite(bounds[i]) else None
    return None


def _at_least(top: int | None, mean: int) -> int | None:
    """The longest request's bound, never below the mean (requests past the last finite bucket: that bound is
    all a histogram says, and it can be below their mean)."""
    return None if top is None else max(top, mean)


def _bucket_of(q: float, bounds: tuple[float, ...], cum: list[float]) -> tuple[float, float]:
    """(lower, upper) edges of the bucket the q-quantile falls in (upper +Inf for the last)."""
    rank = q * cum[-1]
    for i, c in enumerate(cum):
        if c >= rank and c > 0:
            return (bounds[i - 1] if i else 0.0), bounds[i]
    return (bounds[-2] if len(bounds) > 1 else 0.0), bounds[-1]


def _counter_increase(e: EngineWindow, metric: str, keep: Any = None) -> float:
    """The increase of ``metric`` over the window, summed over its label sets (those ``keep(labels)`` accepts)."""
    return math.fsum(
        math.fsum(deltas([v for _, v in pts]))
        for (name, labels), pts in e.series.items()
        if name == metric and len(pts) >= 2 and (keep is None or keep(dict(labels or ())))
    )


def _block_size(engines: list[EngineWindow]) -> int | None:
    """The KV block size the server reports (vllm:cache_config_info's block_size; the largest where engines
    differ), or None where it does not say."""
    sizes = [b for e in engines if (b := kv_block_size(e.config)) is not None]
    return max(sizes) if sizes else None


def _has(engines: list[EngineWindow], metric: str) -> bool:
    return any(name == metric for e in engines for name, _ in e.series)


def _turned_away(engines: list[EngineWindow]) -> tuple[dict[str, float], list[str]]:
    """Requests of the window a server did not serve to the end, by kind, and the evidence it could not read.

    aborted: vLLM's finished_reason abort or error (a request cut short); rejected: admission rejections (a queue
    limit); http_errors: 4xx/5xx answers on the OpenAI routes (/v1/...), which is how vLLM refuses a prompt longer
    than its max-model-len (a 400 that never reaches the engine, so no vllm: counter sees it)."""
    out = {
        "aborted": math.fsum(
            _counter_increase(e, VLLM_REQUEST_SUCCESS_TOTAL, lambda lb: lb.get("finished_reason") in ("abort", "error"))
            for e in engines
        ),
        "rejected": math.fsum(_counter_increase(e, VLLM_ADMISSION_REJECTIONS_TOTAL) for e in engines),
        "http_errors": max(
            (
                _counter_increase(
                    e,
                    "http_requests_total",
                    lambda lb: lb.get("status", "")[:1] in ("4", "5") and lb.get("handler", "").startswith("/v1/"),
                )
                for e in engines
            ),
            default=0.0,
        ),  # one per endpoint: every engine of it carries the same series
    }
    unread = [] if _has(engines, "http_requests_total") else ["http_requests_total (rejections at the API)"]
    return out, unread


def _chi2(p: float, df: int) -> float:
    """The p-quantile of chi-square with df degrees of freedom (Wilson-Hilferty; within 1% from df 3)."""
    z = _norm_ppf(p)
    return df * max(0.0, 1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _norm_ppf(p: float) -> float:
    """The standard normal p-quantile (bisection on erf: exact enough for an interval's edges)."""
    lo, hi = -10.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _inner_busy(intervals: Any) -> list[Any]:
    """The busy intervals, less the first and last of each busy stretch (traffic that started or stopped inside
    them: partial counts, which read as bursts) when the stretch has more than two."""
    out, stretch = [], []
    for iv in [*intervals, None]:
        if iv is not None and iv.busy:
            stretch.append(iv)
            continue
        out += stretch[1:-1] if len(stretch) > 2 else stretch
        stretch = []
    return out


def _burstiness(intervals: Any) -> tuple[int, tuple[float, float, float] | None]:
    """(busy intervals used, (gamma shape, its 95% low, high)), the shape None with fewer than 4 intervals. The
    index of dispersion takes each interval against what its own length expects (scrapes drift apart on a loaded
    host); for equal intervals it is variance / mean. (k - 1) x dispersion / the true one is chi-square with k - 1
    degrees of freedom. Within [0.1, 10]."""
    busy = _inner_busy(intervals)  # idle gaps are no rate, and a stretch's ends are partial intervals
    k = len(busy)
    rate = math.fsum(iv.finished for iv in busy) / math.fsum(iv.seconds for iv in busy) if k else 0.0
    if k < 4 or rate <= 0:
        return k, None
    disp = math.fsum((iv.finished - rate * iv.seconds) ** 2 / (rate * iv.seconds) for iv in busy) / (k - 1)
    shape = round(min(10.0, max(0.1, 1 / disp)), 3) if disp > 0 else 10.0
    lo_d, hi_d = (k - 1) * disp / _chi2(0.975, k - 1), (k - 1) * disp / _chi2(0.025, k - 1)
    low = min(10.0, max(0.1, 1 / hi_d)) if hi_d > 0 else 10.0
    high = min(10.0, max(0.1, 1 / lo_d)) if lo_d > 0 else 10.0
    return k, (shape, low, high)


def _rate(count: float, intervals: Any, burstiness: float) -> tuple[float, Inferred]:
    """``count`` arrivals over the window's traffic: the window less the idle scrape intervals at its two ends.

    A window that begins before the traffic or ends after it (a replay read back with a margin, a server started
    for it) would otherwise spread the arrivals over seconds that had none: corpus shapes served for 150 s and read
    back over a window ~25 s longer read 11-15% below the rate their client sent, and six of eight intervals missed
    it (bench/workload_rate.py). Traffic that started after the window's start did so somewhere inside its first busy
    interval: the span counts half of that interval, and the bounds all or none of it (likewise at the end). Idle
    gaps inside the traffic stay: they are part of its arrivals (burstiness). A window busy from end to end is
    unchanged."""
    ivs = list(intervals)
    busy = [i for i, iv in enumerate(ivs) if iv.busy]
    secs = math.fsum(iv.seconds for iv in ivs)
    lead = trail = cut_hi = 0.0
    if busy:
        first, last = busy[0], busy[-1]
        lead = math.fsum(iv.seconds for iv in ivs[:first])
        trail = math.fsum(iv.seconds for iv in ivs[last + 1 :])
        # traffic that began (ended) inside the window took anything from all to none of its first (last) busy interval
        cut_hi = (ivs[first].seconds if lead else 0.0) + (ivs[last].seconds if trail else 0.0)
    span = secs - lead - trail
    if span - cut_hi <= 0:  # traffic inside one or two intervals: no shorter span to bound it by
        cut_hi = 0.0
    mid = span - cut_hi / 2
    if mid <= 0:
        return 0.0, Inferred(note=f"{count:.0f} arrivals: no span of traffic to spread them over")
    rate = count / mid
    z = 1.96 * math.sqrt(max(count, 1.0) / burstiness)
    low, high = max(0.0, count - z) / span, (count + z) / (span - cut_hi)
    idle = f", the window's {lead:.0f}s before and {trail:.0f}s after without traffic left out" if lead or trail else ""
    edge = f" (it began or ended inside a scrape interval: {span - cut_hi:.0f}-{span:.0f}s)" if cut_hi else ""
    note = f"{count:.0f} arrivals in {mid:.0f}s of traffic{edge}{idle}: 95% interval of a count with this burstiness"
    return rate, Inferred(low=_r(low, 4), high=_r(high, 4), note=note)


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, digits)


def from_window(window: TargetWindow, *, max_model_len: int | None = None, limit_source: str = "") -> Workload | None:
    """The workload of a vLLM window; None when it finished no request (nothing to replay).

    ``max_model_len``: the limit in force while the window was served (``limit_source`` says where it was read):
    when the window proves it held every request, the longest request is capped there (the module docstring)."""
    engines = [e for e in window.engines if e.series or e.hists]
    prompt, gen = _sum_hist(engines, _PROMPT), _sum_hist(engines, _GEN)
    if prompt is None or gen is None:
        return None
    p_bounds, p_cum, p_sum, p_count = prompt
    g_bounds, g_cum, g_sum, g_count = gen
    n = int(p_count)
    mean = p_sum / p_count  # exact: the histogram's sum / count
    input_len = max(1, round(mean))
    output_len = max(1, round(g_sum / g_count))
    inferred: dict[str, Inferred] = {
        "input_len": Inferred(
            low=input_len, high=input_len, note=f"exact: the mean of {n} prompts (the histogram's sum / count)"
        ),
        "output_len": Inferred(low=output_len, high=output_len, note=f"exact: the mean of {int(g_count)} outputs"),
    }
    p10, p90 = histogram_quantile(0.1, p_bounds, p_cum), histogram_quantile(0.9, p_bounds, p_cum)
    spread = (p90 - p10) / (1.6 * mean) if math.isfinite(p10) and math.isfinite(p90) else 0.0
    (a1, b1), (a2, b2) = _bucket_of(0.1, p_bounds, p_cum), _bucket_of(0.9, p_bounds, p_cum)
    where = (
        f"P10 and P90 both in the ({a1:g}, {b1:g}] token bucket"
        if (a1, b1) == (a2, b2)
        else f"P10 in ({a1:g}, {b1:g}], P90 in ({a2:g}, {b2:g}] tokens"
    )
    # the replay's prompts are uniform on mean x [1 - r, 1 + r], so P10 = mean x (1 - 0.8r), P90 = mean x (1 + 0.8r):
    # with the mean exact, each quantile's bucket bounds r on its own (P10 and P90 in (200, 500] with a mean of 260
    # allow r up to (1 - 200/260) / 0.8 = 0.288, where their difference alone allows 0.721)
    lo_r = max(0.0, (1 - b1 / mean) / 0.8, (a2 / mean - 1) / 0.8)
    hi_r = min(0.9, (1 - a1 / mean) / 0.8, (b2 / mean - 1) / 0.8 if math.isfinite(b2) else 0.9)
    if lo_r <= hi_r:
        allow = f"with the exact mean of {mean:.4g}, a spread around it fits the buckets for {lo_r:.3g}-{hi_r:.3g}"
    else:  # no spread even around the mean fits (a skewed mix): what the quantiles' difference alone allows
        lo_r = min(0.9, max(0.0, (a2 - b1) / (1.6 * mean)))
        hi_r = max(lo_r, min(0.9, (b2 - a1) / (1.6 * mean)) if math.isfinite(b2) else 0.9)
        allow = (
            f"no spread even around the mean fits the buckets (a skewed mix); their edges allow {lo_r:.3g}-{hi_r:.3g}"
        )
    range_ratio = round(min(hi_r, max(lo_r, spread)), 3)
    inferred["range_ratio"] = Inferred(
        low=_r(lo_r),
        high=_r(hi_r),
        note=f"{where}: {allow}; the value assumes prompts spread evenly inside each bucket, within that",
    )

    load = profile(window)
    rate = load.offered_rps if load is not None and load.offered_rps else None
    burstiness = 1.0
    if load is None or load.saturated:
        inferred["burstiness"] = Inferred(
            note="assumed 1 (Poisson): the window was saturated, and a queued "
            "server's finishes follow its batches, not the arrivals"
            if load is not None
            else "assumed 1 (Poisson): too few scrapes"
        )
    else:
        k, est = _burstiness(load.intervals)
        if est is not None:
            burstiness, lo_b, hi_b = est
            inferred["burstiness"] = Inferred(
                low=_r(lo_b),
                high=_r(hi_b),
                note=(
                    f"mean / variance of the requests finished in {k} busy scrape intervals: 95% interval "
                    f"{lo_b:.3g}-{hi_b:.3g} (chi-square, {k - 1} degrees of freedom); finishes, not arrivals (a "
                    "server's batches make them read burstier), and bursts shorter than a scrape interval do not show"
                ),
            )
        else:
            inferred["burstiness"] = Inferred(note=f"assumed 1 (Poisson): {k} busy scrape intervals, fewer than 4")
    if rate and load is not None:
        rate, inferred["rate_rps"] = _rate(rate * (load.end - load.start), load.intervals, burstiness)

    hits = math.fsum(_counter_increase(e, VLLM_PREFIX_CACHE_HITS_TOTAL) for e in engines)
    queries = math.fsum(_counter_increase(e, VLLM_PREFIX_CACHE_QUERIES_TOTAL) for e in engines)
    hit_ratio = round(hits / queries, 4) if queries > 0 else None
    prefix_len = min(input_len - 1, round((hit_ratio or 0.0) * input_len))
    if hit_ratio is not None:
        # vLLM hits whole KV blocks only: a prefix that every prompt shares of L tokens hits floor(L / block) blocks,
        # so one of 86 tokens in 128-token blocks (vLLM CPU's) hits nothing and reads as no prefix at all
        block = _block_size(engines)
        said = (
            f"prefix-cache hits / queries = {hit_ratio:g} of the prompt tokens (exact), replayed as one prefix every "
            "prompt shares, which hits as often"
        )
        if block is None:
            inferred["prefix_len"] = Inferred(
                low=prefix_len,
                note=f"{said}; hits come in whole KV blocks of a size the server did not report, so a prefix every "
                "prompt shares is at least this long and may be up to a block longer",
            )
        elif 0 < prefix_len < block:
            # fewer hits a prompt than one block: a prefix every prompt shares hits a whole block each or nothing, so
            # none explains them; some prompts shared whole blocks with others (vLLM's random dataset starts each
            # prompt at a random token of the vocabulary: on the tiny model's 4,096, tens of a few hundred prompts
            # begin alike). A shared prefix shorter than a block hits nothing: replayed as none, which hits as often
            prefix_len = 0
            inferred["prefix_len"] = Inferred(
                low=0,
                high=min(input_len - 1, block - 1),
                note=f"prefix-cache hits / queries = {hit_ratio:g} of the prompt tokens (exact), "
                f"{hit_ratio * input_len:.0f} tokens a prompt: less than one block of {block}, which a prefix every "
                "prompt shares would hit whole (or not at all); some prompts shared whole blocks with others, not "
                "one prefix with all of them. Replayed as none (a shared prefix shorter than a block hits nothing)",
            )
        else:
            high = max(prefix_len, min(input_len - 1, prefix_len + block - 1))
            inferred["prefix_len"] = Inferred(
                low=prefix_len,
                high=high,
                note=f"{said}; hits come in whole blocks of {block} tokens, so a prefix every prompt shares is "
                f"{prefix_len}-{high} tokens long (the part of it past the last whole block never hits); where only "
                "some prompts share one, theirs is longer",
            )

    longest = _longest(
        _top_bucket(p_bounds, p_cum), _top_bucket(g_bounds, g_cum), engines, n, max_model_len, limit_source
    )
    inferred.update(longest[3])
    return Workload(
        input_len=input_len,
        output_len=output_len,
        range_ratio=range_ratio,
        prefix_len=prefix_len,
        rate_rps=round(rate, 4) if rate else None,
        burstiness=burstiness,
        prefix_hit_ratio=hit_ratio,
        max_prompt_tokens=_at_least(longest[0], input_len),
        max_output_tokens=_at_least(longest[1], output_len),
        max_request_tokens=longest[2],
        requests=n,
        source="store",
        window_s=round((window.end_ms - window.start_ms) / 1000, 3),
        inferred=inferred,
    )


def _longest(
    prompt: tuple[int, int | None] | None,
    output: tuple[int, int | None] | None,
    engines: list[EngineWindow],
    n: int,
    max_model_len: int | None,
    limit_source: str,
) -> tuple[int | None, int | None, int | None, dict[str, Inferred]]:
    """The longest prompt, output and request, with what the window proves of each (see the module docstring)."""
    notes: dict[str, Inferred] = {}
    top: list[int | None] = []
    for name, bucket in (("max_prompt_tokens", prompt), ("max_output_tokens", output)):
        if bucket is None:
            top.append(None)
            continue
        lower, upper = bucket
        top.append(upper if upper is not None else lower or None)
        notes[name] = Inferred(
            low=lower + 1,
            high=upper,
            note=(
                f"the highest bucket used is ({lower}, {upper}]: the longest lies in it"
                if upper is not None
                else f"the longest lies above {lower} (the +Inf bucket): the histogram bounds it no further"
            ),
        )
    if top[0] is None or top[1] is None:
        return top[0], top[1], None, notes
    total = top[0] + top[1]
    low = max(notes["max_prompt_tokens"].low or 1, notes["max_output_tokens"].low or 1) + 1
    away, unread = _turned_away(engines)
    refused = {k: v for k, v in away.items() if v > 0}
    if max_model_len is None:
        why = (
            "the max-model-len in force is unknown (set max_model_len in the target's flags), so the buckets' "
            "edges stand"
        )
    elif refused:
        why = (
            f"not capped at max-model-len {max_model_len}: the window did not serve every request ("
            + ", ".join(f"{v:.0f} {k.replace('_', ' ')}" for k, v in refused.items())
            + "): longer requests may have been refused, so the buckets' edges stand"
        )
    else:
        capped = min(total, max_model_len)
        for name in ("max_prompt_tokens", "max_output_tokens"):
            hi = notes[name].high
            notes[name] = notes[name].model_copy(
                update={"high": min(hi, max_model_len - 1) if hi else max_model_len - 1}
            )
        seen = "" if not unread else f" (not in the store: {', '.join(unread)})"
        notes["max_request_tokens"] = Inferred(
            low=min(low, capped),
            high=capped,
            note=(
                f"capped at max-model-len {max_model_len}{' (' + limit_source + ')' if limit_source else ''}: the server "
                f"finished all {n} requests of the window, none aborted or refused{seen}, so that limit held every one "
                f"(the buckets' edges alone say {top[0]} + {top[1]} = {total})"
                if capped < total
                else f"the buckets' edges, {top[0]} + {top[1]}; within max-model-len {max_model_len}, which served all {n}"
            ),
        )
        return top[0], top[1], capped, notes
    notes["max_request_tokens"] = Inferred(low=low, high=total, note=f"the buckets' edges, {top[0]} + {top[1]}; {why}")
    return top[0], top[1], total, notes


def parse_workload(text: str, path: str = "<workload>") -> Workload:
    """A workload file's YAML; any problem is a ConfigError naming ``path`` and the key."""
    try:
        data = load_yaml(text) if text.strip() else None
    except YamlTextError as exc:
        raise ConfigError(path, f"line {exc.line}" if exc.line else "", f"not valid YAML: {exc.problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            path,
            "",
            "expected a mapping of workload keys (input_len, output_len, ...; see docs/tune.md, 'Workload files')",
        )
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
    """The file form: every field, None left out (``inferred`` last: what the values rest on)."""
    out = {k: v for k, v in w.model_dump(exclude={"inferred"}).items() if v is not None}
    if w.inferred:
        out["inferred"] = {
            k: {kk: vv for kk, vv in v.model_dump().items() if vv is not None and vv != ""}
            for k, v in w.inferred.items()
        }
    return out


def describe(w: Workload) -> list[str]:
    """One line per inferred value: the value, its interval, how it was read."""
    lines = []
    for key, inf in (w.inferred or {}).items():
        value = getattr(w, key, None)
        lo = "-" if inf.low is None else f"{inf.low:g}"
        hi = "-" if inf.high is None else f"{inf.high:g}"
        bounds = "" if inf.low == inf.high and inf.low is not None else f" [{lo} .. {hi}]"
        lines.append(f"{key:<19} {value if value is not None else '-'}{bounds}: {inf.note}")
    return lines
