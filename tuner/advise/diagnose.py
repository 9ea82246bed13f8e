"""Diagnosis: pure rules from (signals, observed workload, current flags, model, GPU, server, now) to candidates.

Each rule looks at one symptom and proposes flag changes, each with the evidence it read (signals, window,
thresholds crossed), the expected effect, risk and confidence. Alternatives for one symptom carry a rank
(1 = try first). Nothing here is checked for safety: ``recommend.py`` filters every candidate through the
allow-list, the server's version and the memory model. No clock, no I/O: everything comes in ``Inputs``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.advise.facts import GpuFacts, ModelFacts, Observed, ServerFacts
from tuner.advise.memory import vllm_batch_defaults
from tuner.config import Slo
from tuner.signals.derive import EngineSignals

__all__ = ["Inputs", "Candidate", "diagnose", "RULES", "THRESHOLDS"]

THRESHOLDS = {
    "kv_saturated": 0.90,  # KV use (fraction 0-1) at or above which the cache counts as full
    "kv_room": 0.80,  # below this the cache has room for more sequences
    "max_model_len_far_below": 4.0,  # max_model_len >= this x observed P99 prompt+output: far below
    "gpu_headroom": 0.05,  # free GPU memory (fraction of total) worth handing to vLLM
    "ttft_p99_s": 1.0,  # slow TTFT without an SLO, seconds
    "queue_p99_s": 0.25,  # P99 time in vLLM's queue at or above which requests counted as waiting, seconds
    "long_prompt_tokens": 1024,  # a P99 prompt at least this long is "long"
    "itl_spike_ratio": 3.0,  # ITL P99 >= this x ITL P50: spikes
    "repeated_prefix_share": 0.3,  # share of prompt tokens in repeated prefixes worth caching
    "ubatch_long_prompt_factor": 4.0,  # longest request >= this x -ub: long prompts for the ubatch
}
_UTIL_CAP = 0.95  # never propose more than this gpu-memory-utilization
_LLAMA_DEFAULT_BATCH, _LLAMA_DEFAULT_UBATCH = 2048, 512
_OOM = re.compile(
    r"out of memory|OutOfMemoryError|No available memory for the cache blocks|"
    r"larger than the (?:maximum number of tokens that can be stored in KV cache|available KV cache)|"
    r"Insufficient memory|failed to allocate",
    re.IGNORECASE,
)
_KV_TOO_SMALL = re.compile(r"cache blocks|KV cache", re.IGNORECASE)


@dataclass(frozen=True)
class Inputs:
    """Everything one evaluation sees. ``flags`` holds current values by tuner's flag names (flags.py)."""

    target: str
    backend: str  # vllm | llamacpp
    now: float  # unix seconds, the end of the window
    window_s: float
    signals: EngineSignals
    observed: Observed
    flags: Mapping[str, Any] = field(default_factory=dict)
    model: ModelFacts | None = None
    gpu: GpuFacts = GpuFacts(vendor="none")
    server: ServerFacts = ServerFacts()
    live: Mapping[str, str] = field(default_factory=dict)  # vllm:cache_config_info labels / llama /props
    slo: Slo | None = None
    startup_error: str | None = None  # the log of a start that failed, when there was one
    repeated_prefix_share: float | None = None  # fraction 0-1 of prompt tokens in repeated prefixes (operator)
    host_memory_available_bytes: int | None = None  # for CPU-resident KV (llama-server without -ngl)
    # A managed server's command line as tuner builds it: its tunable flags (tuner's names) and extra_args (as the
    # config spells them). None: a server tuner did not start, whose command line it does not know.
    started_with: Mapping[str, Any] | None = None

    @property
    def kv_capacity_tokens(self) -> int | None:
        """What the running server says its KV cache holds (vLLM); llama-server: -c."""
        text = self.live.get("kv_cache_size_tokens")
        if text and text.replace(".", "", 1).isdigit():
            return int(float(text))
        if self.backend == "llamacpp" and self.flags.get("ctx_size"):
            return int(self.flags["ctx_size"])
        return None


@dataclass(frozen=True)
class Candidate:
    """One proposed change, before the safety filter."""

    rule: str
    diff: Mapping[str, Any]  # flag -> proposed value
    # flag -> current value; None: the server runs without it (its default), as far as tuner knows; a flag left out:
    # not known (what the rule read could be either)
    current: Mapping[str, Any]
    evidence: Mapping[str, Any]  # window, signals read, thresholds crossed
    expected_effect: str
    risk: str  # low | medium | high, then why
    confidence: float  # 0-1
    rank: int = 1  # order among the alternatives of one rule
    kv_tokens_needed: int | None = None  # the memory check must find at least this many KV tokens after


def _crossed(signal: str, value: float | None, op: str, threshold: float | None) -> dict[str, Any]:
    return {"signal": signal, "value": value, "op": op, "threshold": threshold}


def _evidence(inp: Inputs, crossed: list[dict[str, Any]], **read: Any) -> dict[str, Any]:
    return {
        "window_s": inp.window_s,
        "at": inp.now,
        "engine": inp.signals.engine,
        "thresholds": crossed,
        "signals": {k: v for k, v in read.items() if v is not None},
    }


def _pow2_at_least(n: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1.0, n))))


def _current(inp: Inputs, name: str, default: Any = None) -> Any:
    value = inp.flags.get(name)
    return default if value is None else value


# ---- vLLM ---------------------------------------------------------------------------------------


def kv_saturated(inp: Inputs) -> list[Candidate]:
    """KV cache full with preemptions: fewer sequences, more memory, fp8 KV, or a shorter max-model-len.

    The preemption counter is the proof: vLLM preempts a running sequence only when the KV cache cannot give it
    another block, and no missed scrape loses a count. The KV-use gauge is sampled, and a loaded CPU vLLM answers
    /metrics late exactly while it preempts, so its peak is evidence where a scrape caught it, never a condition.
    """
    o = inp.observed
    if o.preemptions is None or o.preemptions <= 0:
        return []
    crossed = [_crossed("preemptions", o.preemptions, ">", 0)]
    if o.kv_usage_max is not None and o.kv_usage_max >= THRESHOLDS["kv_saturated"]:
        crossed.insert(0, _crossed("kv_cache_usage_max", o.kv_usage_max, ">=", THRESHOLDS["kv_saturated"]))
    ev = _evidence(
        inp,
        crossed,
        kv_cache_usage_max=o.kv_usage_max,
        preemptions=o.preemptions,
        preemptions_per_s=inp.signals.preemptions_per_s,
        requests_running_max=o.running_max,
        mean_request_tokens=o.mean_request_tokens,
        request_p99_tokens=o.request_p99_tokens,
        kv_capacity_tokens=inp.kv_capacity_tokens,
    )
    out: list[Candidate] = []
    seqs = _current(inp, "max_num_seqs")
    length = _current(inp, "max_model_len")
    p99 = o.request_p99_tokens
    if length and p99 and length >= THRESHOLDS["max_model_len_far_below"] * p99:
        new_len = max(128, _pow2_at_least(2 * p99))
        if new_len < length:
            out.append(
                Candidate(
                    "vllm.kv_saturated",
                    {"max_model_len": new_len},
                    {"max_model_len": length},
                    {
                        **ev,
                        "thresholds": crossed
                        + [
                            _crossed(
                                "max_model_len / request_p99_tokens",
                                length / p99,
                                ">=",
                                THRESHOLDS["max_model_len_far_below"],
                            )
                        ],
                    },
                    f"each sequence may reserve at most {new_len} tokens instead of {length} ({length / new_len:g}x "
                    "less); requests longer than that are refused",
                    "medium: requests longer than the new limit get an error",
                    0.6,
                    rank=4,
                )
            )
    g = inp.gpu
    util = _current(inp, "gpu_memory_utilization")
    if g.vendor == "nvidia" and g.other_processes == 0 and util and g.memory_total_bytes and g.memory_free_bytes:
        free_share = g.memory_free_bytes / g.memory_total_bytes
        new_util = round(min(_UTIL_CAP, util + free_share - 0.02), 2)
        if free_share >= THRESHOLDS["gpu_headroom"] and new_util > util:
            out.append(
                Candidate(
                    "vllm.kv_saturated",
                    {"gpu_memory_utilization": new_util},
                    {"gpu_memory_utilization": util},
                    {
                        **ev,
                        "thresholds": crossed
                        + [_crossed("gpu_memory_free_share", free_share, ">=", THRESHOLDS["gpu_headroom"])],
                        "gpu": {"name": g.name, "free_bytes": g.memory_free_bytes, "other_processes": 0},
                    },
                    f"about {(new_util - util) * g.memory_total_bytes / 2**30:.1f} GiB more KV cache per GPU",
                    "low: the GPU is not shared and the memory is free now",
                    0.7,
                    rank=2,
                )
            )
    if g.fp8 and _current(inp, "kv_cache_dtype") == "auto":
        out.append(
            Candidate(
                "vllm.kv_saturated",
                {"kv_cache_dtype": "fp8"},
                {"kv_cache_dtype": "auto"},
                {**ev, "gpu": {"name": g.name, "fp8": True}},
                "KV bytes per token halve: about twice the tokens fit in the same memory",
                "medium: fp8 KV can shift outputs slightly; compare quality",
                0.6,
                rank=3,
            )
        )
    cur = seqs if seqs is not None else o.running_max
    if cur and cur > 1:
        capacity, mean = inp.kv_capacity_tokens, o.mean_request_tokens
        fit = int(capacity // mean) if capacity and mean else None
        new = fit if fit is not None and 1 <= fit < cur else max(1, math.floor(cur * 3 / 4))
        if new < cur:
            out.append(
                Candidate(
                    "vllm.kv_saturated",
                    {"max_num_seqs": int(new)},
                    {"max_num_seqs": seqs},
                    {
                        **ev,
                        "basis": (
                            f"KV capacity {capacity} tokens / mean request {mean:.0f} tokens = {fit}"
                            if fit is not None and 1 <= fit < cur
                            else "three quarters of the current cap"
                        ),
                    },
                    "fewer sequences share the KV cache: preemptions (and their recomputation) stop; "
                    "throughput may drop a little, tail latency improves",
                    "low: only admission changes",
                    0.8,
                    rank=1,
                )
            )
    return out


def queue_with_kv_room(inp: Inputs) -> list[Candidate]:
    """Requests wait while the KV cache has room and the scheduler runs its maximum: raise max-num-seqs.

    Waiting is seen in the waiting gauge, or, when no scrape caught the queue (a loaded server can answer
    /metrics late exactly then), in the queue-time histogram, whose counts no missed scrape loses. KV room is seen
    in the KV gauge, or, when no scrape of the loaded server was stored at all, in a preemption count of 0.
    """
    o = inp.observed
    queue_p99 = inp.signals.queue_p99
    seqs = _current(inp, "max_num_seqs")
    # The gauges saw the plateau: requests waited while the scheduler ran its maximum. Otherwise (a scrape missed
    # the queue, or the running plateau: a loaded CPU vLLM answers /metrics between engine steps) the histogram.
    cap_seen = seqs if seqs is not None else o.running_max
    by_gauges = bool(o.waiting_max and o.waiting_max >= 1 and cap_seen and (o.running_max or 0) >= cap_seen)
    by_histogram = not by_gauges and queue_p99 is not None and queue_p99 >= THRESHOLDS["queue_p99_s"]
    if not by_gauges and not by_histogram:
        return []
    if o.kv_usage_max is not None and o.kv_usage_max >= THRESHOLDS["kv_room"]:
        return []
    # No stored scrape of the loaded server at all (it answered /metrics late the whole time): the KV cache's room
    # is then read from the preemption counter, which no missed scrape loses (a full KV cache preempts).
    no_loaded_sample = o.kv_usage_max is None or not o.running_max
    if no_loaded_sample and (not by_histogram or o.preemptions is None or o.preemptions > 0):
        return []
    inferred = seqs is None
    cap = o.running_max if inferred else seqs
    assert cap is not None  # inferred only when the gauges saw the plateau (by_gauges: running_max > 0)
    # Seen only in the histogram, the gauges missed the busy moments: long queue times while the KV cache had
    # room mean admission was capped.
    if by_histogram and inferred:  # no gauge saw the plateau: nothing to infer max-num-seqs from
        return []
    new = int(2 * cap if by_histogram else min(2 * cap, cap + math.ceil(o.waiting_max or 0)))
    waited = (
        _crossed("queue_p99", queue_p99, ">=", THRESHOLDS["queue_p99_s"])
        if by_histogram
        else _crossed("requests_waiting_max", o.waiting_max, ">=", 1)
    )
    crossed = [waited] + (
        [_crossed("preemptions", o.preemptions, "==", 0)]
        if no_loaded_sample
        else [_crossed("kv_cache_usage_max", o.kv_usage_max, "<", THRESHOLDS["kv_room"])]
    )
    if by_gauges:
        crossed.append(_crossed("requests_running_max", o.running_max, ">=", cap))
    ev = _evidence(
        inp,
        crossed,
        requests_waiting_max=o.waiting_max,
        requests_running_max=o.running_max,
        kv_cache_usage_max=o.kv_usage_max,
        queue_p99=inp.signals.queue_p99,
        preemptions=o.preemptions,
        mean_request_tokens=o.mean_request_tokens,
        kv_capacity_tokens=inp.kv_capacity_tokens,
    )
    if inferred:
        ev["basis"] = "max-num-seqs not given: inferred from the running plateau while requests waited"
    needed = int(math.ceil(new * o.mean_request_tokens)) if o.mean_request_tokens else None
    return [
        Candidate(
            "vllm.queue_with_kv_room",
            {"max_num_seqs": new},
            {"max_num_seqs": seqs},
            ev,
            f"up to {new} sequences run at once instead of {cap:g}: queue time falls, throughput rises "
            "while the KV cache has room",
            "low: preemptions return if the KV cache fills; tuner watches for that",
            0.5 if inferred else 0.8,
            kv_tokens_needed=needed,
        )
    ]


def slow_ttft_long_prompts(inp: Inputs) -> list[Candidate]:
    """Slow TTFT with long prompts: chunked prefill on, and a step budget that takes a long prompt in few chunks."""
    s, o = inp.signals, inp.observed
    budget = inp.slo.ttft_p99.total_seconds() if inp.slo and inp.slo.ttft_p99 else THRESHOLDS["ttft_p99_s"]
    if s.ttft_p99 is None or o.prompt_p99 is None or s.ttft_p99 <= budget:
        return []
    if o.prompt_p99 < THRESHOLDS["long_prompt_tokens"]:
        return []
    crossed = [
        _crossed("ttft_p99", s.ttft_p99, ">", budget),
        _crossed("prompt_p99_tokens", o.prompt_p99, ">=", THRESHOLDS["long_prompt_tokens"]),
    ]
    ev = _evidence(
        inp, crossed, ttft_p99=s.ttft_p99, ttft_p50=s.ttft_p50, prompt_p99_tokens=o.prompt_p99, queue_p99=s.queue_p99
    )
    chunked, batched = _current(inp, "enable_chunked_prefill"), _current(inp, "max_num_batched_tokens")
    if chunked is False:
        return [
            Candidate(
                "vllm.slow_ttft_long_prompts",
                {"enable_chunked_prefill": True, "max_num_batched_tokens": 2048},
                {"enable_chunked_prefill": False, "max_num_batched_tokens": batched},
                ev,
                "long prefills are split into 2048-token chunks batched with decodes: waiting requests "
                "start sooner, TTFT tail falls",
                "low: vLLM's default in V1",
                0.7,
            )
        ]
    if batched is not None and batched < o.prompt_p99:
        new = min(16384, _pow2_at_least(o.prompt_p99))
        if new > batched:
            return [
                Candidate(
                    "vllm.slow_ttft_long_prompts",
                    {"max_num_batched_tokens": new},
                    {"max_num_batched_tokens": batched},
                    ev,
                    f"a P99 prompt is prefilled in {math.ceil(o.prompt_p99 / new)} step(s) instead of "
                    f"{math.ceil(o.prompt_p99 / batched)}: TTFT falls",
                    "medium: bigger steps raise activation memory and can lengthen ITL",
                    0.6,
                )
            ]
    return []


def itl_prefill_interference(inp: Inputs) -> list[Candidate]:
    """ITL spikes while long prefills run: a smaller step budget interleaves them more finely."""
    s, o = inp.signals, inp.observed
    if s.itl_p50 is None or s.itl_p99 is None or s.itl_p50 <= 0 or not s.prompt_tokens_per_s:
        return []
    ratio = s.itl_p99 / s.itl_p50
    batched = _current(inp, "max_num_batched_tokens")
    if ratio < THRESHOLDS["itl_spike_ratio"] or batched is None or batched <= 2048:
        return []
    if inp.slo and inp.slo.itl_p99 and s.itl_p99 <= inp.slo.itl_p99.total_seconds():
        return []
    floor = max(2048, int(_current(inp, "max_num_seqs", 0)))
    new = max(floor, int(batched // 2))
    if new >= batched:
        return []
    crossed = [
        _crossed("itl_p99 / itl_p50", ratio, ">=", THRESHOLDS["itl_spike_ratio"]),
        _crossed("max_num_batched_tokens", batched, ">", 2048),
    ]
    ev = _evidence(
        inp,
        crossed,
        itl_p50=s.itl_p50,
        itl_p99=s.itl_p99,
        prompt_tokens_per_s=s.prompt_tokens_per_s,
        prompt_p99_tokens=o.prompt_p99,
    )
    return [
        Candidate(
            "vllm.itl_prefill_interference",
            {"max_num_batched_tokens": new},
            {"max_num_batched_tokens": batched},
            ev,
            f"each step carries at most {new} tokens: a prefill chunk delays running decodes less, ITL spikes shrink",
            "medium: long prompts take more steps, TTFT may rise",
            0.6,
        )
    ]


def prefix_caching_off(inp: Inputs) -> list[Candidate]:
    """Repeated prefixes while prefix caching is off: turn it on."""
    share = inp.repeated_prefix_share
    if _current(inp, "enable_prefix_caching") is not False or share is None:
        return []
    if share < THRESHOLDS["repeated_prefix_share"]:
        return []
    crossed = [
        _crossed("repeated_prefix_share", share, ">=", THRESHOLDS["repeated_prefix_share"]),
        _crossed("enable_prefix_caching", 0, "==", 0),
    ]
    ev = _evidence(
        inp,
        crossed,
        repeated_prefix_share=share,
        prompt_tokens_per_s=inp.signals.prompt_tokens_per_s,
        ttft_p99=inp.signals.ttft_p99,
    )
    return [
        Candidate(
            "vllm.prefix_caching_off",
            {"enable_prefix_caching": True},
            {"enable_prefix_caching": False},
            ev,
            f"about {share:.0%} of prompt tokens are served from cache instead of recomputed: "
            "TTFT and prefill load fall",
            "low: cached blocks are evicted first when memory is short",
            0.7,
        )
    ]


def gpu_shared(inp: Inputs) -> list[Candidate]:
    """Other processes use the GPU: claim only what is left for vLLM."""
    g = inp.gpu
    util = _current(inp, "gpu_memory_utilization")
    if g.vendor != "nvidia" or g.other_processes < 1 or not g.memory_total_bytes or util is None:
        return []
    left = (g.memory_total_bytes - g.other_used_bytes) / g.memory_total_bytes
    new = math.floor((left - 0.02) * 100) / 100
    if new >= util:
        return []
    crossed = [
        _crossed("gpu_other_processes", g.other_processes, ">=", 1),
        _crossed("gpu_memory_utilization + other_share", util + 1 - left, ">", 0.98),
    ]
    ev = _evidence(
        inp,
        crossed,
        gpu_other_processes=g.other_processes,
        gpu_other_used_bytes=g.other_used_bytes,
        gpu_memory_total_bytes=g.memory_total_bytes,
    )
    return [
        Candidate(
            "vllm.gpu_shared",
            {"gpu_memory_utilization": new},
            {"gpu_memory_utilization": util},
            ev,
            f"vLLM claims {new:.0%} of the GPU, leaving the other processes' {1 - left:.0%}: no OOM at the "
            "next start or when they grow",
            "medium: the KV cache shrinks",
            0.8,
        )
    ]


def startup_oom(inp: Inputs) -> list[Candidate]:
    """The server died of OOM at start: the seed's remedies in order (utilization, max-model-len, max-num-seqs,
    quantization, tensor parallelism), each a separate candidate ranked 1-5."""
    if not inp.startup_error or not _OOM.search(inp.startup_error):
        return []
    line = next((ln for ln in inp.startup_error.splitlines() if _OOM.search(ln)), "")[:300]
    ev = _evidence(inp, [{"signal": "startup_log", "value": line, "op": "matches", "threshold": _OOM.pattern}])
    g, out = inp.gpu, []
    util = _current(inp, "gpu_memory_utilization", 0.9)
    kv_short = bool(_KV_TOO_SMALL.search(line))
    if g.other_processes and g.memory_total_bytes:
        new_util = math.floor(((g.memory_total_bytes - g.other_used_bytes) / g.memory_total_bytes - 0.02) * 100) / 100
    else:
        new_util = _UTIL_CAP if kv_short else round(util - 0.05, 2)
    if new_util != util:
        out.append(
            Candidate(
                "vllm.startup_oom",
                {"gpu_memory_utilization": new_util},
                {"gpu_memory_utilization": util},
                ev,
                "the memory vLLM claims matches what the GPU can give it",
                "low",
                0.6,
                rank=1,
            )
        )
    length = _current(inp, "max_model_len") or (inp.model.max_position_embeddings if inp.model else None)
    if length and length > 2048:
        out.append(
            Candidate(
                "vllm.startup_oom",
                {"max_model_len": int(length // 2)},
                {"max_model_len": length},
                ev,
                "one full-length sequence needs half the KV cache",
                "medium: longer requests refused",
                0.5,
                rank=2,
            )
        )
    default_seqs, _ = vllm_batch_defaults(
        g.memory_total_bytes, g.name, tensor_parallel_size=int(_current(inp, "tensor_parallel_size", 1) or 1)
    )
    seqs = _current(inp, "max_num_seqs", default_seqs)
    if seqs > 1:
        out.append(
            Candidate(
                "vllm.startup_oom",
                {"max_num_seqs": max(1, int(seqs // 2))},
                {"max_num_seqs": seqs},
                ev,
                "smaller sampler and activation buffers at start",
                "low: less concurrency",
                0.4,
                rank=3,
            )
        )
    if inp.model and not inp.model.quantization and g.fp8:
        out.append(
            Candidate(
                "vllm.startup_oom",
                {"quantization": "fp8"},
                {"quantization": None},
                ev,
                "weights take about half the memory",
                "medium: quality may shift slightly",
                0.5,
                rank=4,
            )
        )
    tp = _current(inp, "tensor_parallel_size", 1)
    if g.count >= 2 * tp:
        out.append(
            Candidate(
                "vllm.startup_oom",
                {"tensor_parallel_size": 2 * tp},
                {"tensor_parallel_size": tp},
                ev,
                "weights and KV cache are split over twice the GPUs",
                "medium: uses more GPUs, adds communication",
                0.5,
                rank=5,
            )
        )
    return out


# ---- llama-server -------------------------------------------------------------------------------


def llama_deferred(inp: Inputs) -> list[Candidate]:
    """Deferred requests with every slot busy: more --parallel, keeping each slot's context >= the longest request."""
    o = inp.observed
    slots = _current(inp, "parallel") or o.slots_total
    if not o.deferred_max or o.deferred_max < 1 or not slots or (o.slots_busy_max or 0) < slots:
        return []
    # -c as the command line or the config says; else the least it can be (tuner/advise/facts.py
    # flags_from_live_config): one slot's n_ctx, which is all of -c on a server started without --parallel
    known = _current(inp, "ctx_size")
    ctx = known or o.slot_context_tokens
    if not ctx:
        return []
    slots, ctx = int(slots), int(ctx)
    per_slot = ctx // slots if known else ctx  # one slot's context now (at least, where -c is not known)
    needed = int(o.max_request_tokens or per_slot)
    current = {"parallel": slots, **({"ctx_size": ctx} if known else {})}
    target = int(min(2 * slots, slots + math.ceil(o.deferred_max), 256))
    keeps = [p for p in range(target, slots, -1) if ctx // p >= needed]
    crossed = [
        _crossed("requests_deferred_max", o.deferred_max, ">=", 1),
        _crossed("slots_busy_max", o.slots_busy_max or 0, ">=", slots),
    ]
    ev = _evidence(
        inp,
        crossed,
        requests_deferred_max=o.deferred_max,
        slots_busy_max=o.slots_busy_max,
        slots_total=slots,
        slot_context_tokens=per_slot,
        ctx_size=known,
        longest_request_tokens=needed,
    )
    if keeps:
        new = keeps[0]
        return [
            Candidate(
                "llamacpp.deferred",
                {"parallel": new},
                current,
                ev,
                f"{new} slots decode at once instead of {slots}; each keeps {'' if known else 'at least '}"
                f"{ctx // new} tokens of context (longest request seen: {needed})",
                "low: -c is unchanged",
                0.8,
            )
        ]
    new_ctx = int(math.ceil(target * needed / 256) * 256)
    return [
        Candidate(
            "llamacpp.deferred",
            {"parallel": target, "ctx_size": new_ctx},
            current,
            ev,
            f"{target} slots decode at once instead of {slots}; -c {'grows to' if known else 'is set to'} {new_ctx} "
            f"so each slot keeps "
            f"{new_ctx // target} tokens (longest request seen: {needed})",
            "medium: the KV cache grows with -c",
            0.7,
            kv_tokens_needed=new_ctx,
        )
    ]


def llama_offload(inp: Inputs) -> list[Candidate]:
    """-ngl below the model's layers while the GPU has memory free: offload all of them."""
    m, g, ngl = inp.model, inp.gpu, _current(inp, "n_gpu_layers")
    if m is None or ngl is None or g.vendor == "none" or g.memory_free_bytes is None or ngl >= m.num_layers + 1:
        return []
    crossed = [
        _crossed("n_gpu_layers", ngl, "<", m.num_layers + 1),
        _crossed("gpu_memory_free_bytes", g.memory_free_bytes, ">", 0),
    ]
    ev = _evidence(
        inp,
        crossed,
        n_gpu_layers=ngl,
        model_layers=m.num_layers,
        gpu_memory_free_bytes=g.memory_free_bytes,
        generation_tokens_per_s=inp.signals.generation_tokens_per_s,
    )
    return [
        Candidate(
            "llamacpp.offload",
            {"n_gpu_layers": m.num_layers + 1},
            {"n_gpu_layers": ngl},
            ev,
            f"all {m.num_layers} layers and the output run on the GPU: generation speeds up several-fold",
            "low: checked against free GPU memory",
            0.8,
        )
    ]


def llama_batch_long_prompts(inp: Inputs) -> list[Candidate]:
    """Requests many times longer than -ub: a bigger physical batch prefills them in fewer passes."""
    o = inp.observed
    ub = int(_current(inp, "ubatch_size", _LLAMA_DEFAULT_UBATCH))
    b = int(_current(inp, "batch_size", _LLAMA_DEFAULT_BATCH))
    if not o.max_request_tokens or o.max_request_tokens < THRESHOLDS["ubatch_long_prompt_factor"] * ub:
        return []
    new_ub = min(2048, _pow2_at_least(o.max_request_tokens))
    if new_ub <= ub:
        return []
    diff: dict[str, Any] = {"ubatch_size": new_ub}
    if b < new_ub:
        diff["batch_size"] = new_ub
    crossed = [
        _crossed(
            "longest_request_tokens / ubatch_size",
            o.max_request_tokens / ub,
            ">=",
            THRESHOLDS["ubatch_long_prompt_factor"],
        )
    ]
    ev = _evidence(
        inp,
        crossed,
        longest_request_tokens=o.max_request_tokens,
        ubatch_size=ub,
        batch_size=b,
        prompt_tokens_per_s=inp.signals.prompt_tokens_per_s,
    )
    return [
        Candidate(
            "llamacpp.batch_long_prompts",
            diff,
            {"ubatch_size": ub, "batch_size": b},
            ev,
            f"long prompts are prefilled {new_ub} tokens per pass instead of {ub}: faster prompt processing",
            "low: a larger compute buffer",
            0.6,
        )
    ]


_KV_UNIFIED_ARGS = frozenset({"kvu", "kv-unified", "no-kvu", "no-kv-unified"})


def llama_kv_unified(inp: Inputs) -> list[Candidate]:
    """A llama-server started without --parallel, every slot busy: a KV buffer per slot (--parallel N, -c unchanged).

    Left out, --parallel is "auto": the server runs 4 slots on one KV buffer of -c cells that every sequence shares
    (`--kv-unified`'s default "if the number of slots is auto", llama-server --help; its log says
    ``kv_unified = 'true'``). Any --parallel N gives each slot its own -c / N cells. On this project's CPU host the
    shared buffer kept the same 4 slots' requests waiting several times longer for a first token, at the same load
    (bench/results/2026-11-30-1829-llama-kv-unified.md). So where tuner knows the command line (a managed server),
    --parallel is left out, the operator chose no buffer (no --kv-unified / --no-kv-unified in extra_args), -c is
    set, every slot was busy at once and none deferred (then ``llamacpp.deferred`` proposes more slots, which also
    splits the buffer), propose the slots it runs as an explicit count, when each slot's share still holds the
    longest request seen."""
    s, o = inp.started_with, inp.observed
    if s is None or "parallel" in s or any(str(k).lstrip("-") in _KV_UNIFIED_ARGS for k in s):
        return []
    slots, ctx, longest = o.slots_total, s.get("ctx_size"), o.max_request_tokens
    if not slots or slots < 2 or not ctx or (o.slots_busy_max or 0) < slots or (o.deferred_max or 0) >= 1:
        return []
    slots, ctx = int(slots), int(ctx)
    if not longest or ctx // slots < longest:
        return []
    crossed = [
        {"signal": "parallel", "value": "auto", "op": "is", "threshold": "left out: one KV buffer the slots share"},
        _crossed("slots_busy_max", o.slots_busy_max, ">=", slots),
    ]
    ev = _evidence(
        inp,
        crossed,
        slots_total=slots,
        slots_busy_max=o.slots_busy_max,
        requests_deferred_max=o.deferred_max,
        ctx_size=ctx,
        longest_request_tokens=longest,
    )
    return [
        Candidate(
            "llamacpp.kv_unified",
            {"parallel": slots},
            {"parallel": None, "ctx_size": ctx},
            ev,
            f"the same {slots} slots, each with its own {ctx // slots}-token KV buffer instead of one {ctx}-token "
            f"buffer all share (llama-server's default when --parallel is left out): a first token sooner under "
            f"load (longest request seen: {int(longest)})",
            "low: -c is unchanged, and each slot's share holds the longest request seen",
            0.6,
        )
    ]


# ---- both ---------------------------------------------------------------------------------------


def backend_choice(inp: Inputs) -> list[Candidate]:
    """The seed's decision: no GPU or AMD -> llama-server; NVIDIA + LLM -> vLLM; embeddings -> llama-server."""
    g, m = inp.gpu, inp.model
    embedding = bool(m and m.is_embedding)
    if g.vendor in ("none", "amd") or embedding:
        want = "llamacpp"
        why = "embedding model" if embedding else ("no GPU" if g.vendor == "none" else "AMD GPU")
    elif g.vendor == "nvidia" and m is not None:
        want, why = "vllm", "NVIDIA GPU serving a generative LLM"
    else:
        return []
    if want == inp.backend:
        return []
    ev = _evidence(
        inp,
        [{"signal": "gpu_vendor", "value": g.vendor, "op": "is", "threshold": why}],
        gpu_vendor=g.vendor,
        gpu_name=g.name or None,
        embedding_model=embedding,
    )
    effect = {
        "llamacpp": "llama-server runs on CPU / AMD and serves embeddings with less overhead",
        "vllm": "vLLM's paged KV cache and continuous batching serve many concurrent requests faster",
    }[want]
    return [
        Candidate(
            "backend_choice",
            {"backend": want},
            {"backend": inp.backend},
            ev,
            f"{why}: {effect}",
            "high: a different server, model format and flags; plan the move",
            0.5,
        )
    ]


RULES: dict[str, tuple[str, Callable[[Inputs], list[Candidate]]]] = {
    "vllm.kv_saturated": ("vllm", kv_saturated),
    "vllm.queue_with_kv_room": ("vllm", queue_with_kv_room),
    "vllm.slow_ttft_long_prompts": ("vllm", slow_ttft_long_prompts),
    "vllm.itl_prefill_interference": ("vllm", itl_prefill_interference),
    "vllm.prefix_caching_off": ("vllm", prefix_caching_off),
    "vllm.gpu_shared": ("vllm", gpu_shared),
    "vllm.startup_oom": ("vllm", startup_oom),
    "llamacpp.deferred": ("llamacpp", llama_deferred),
    "llamacpp.offload": ("llamacpp", llama_offload),
    "llamacpp.batch_long_prompts": ("llamacpp", llama_batch_long_prompts),
    "llamacpp.kv_unified": ("llamacpp", llama_kv_unified),
    "backend_choice": ("any", backend_choice),
}


def diagnose(inp: Inputs) -> list[Candidate]:
    """Every candidate every rule of this backend proposes, in rule order then rank."""
    out: list[Candidate] = []
    for backend, rule in RULES.values():
        if backend in ("any", inp.backend):
            out.extend(sorted(rule(inp), key=lambda c: c.rank))
    return out
