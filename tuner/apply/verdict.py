"""Keep or roll back: the KPIs of the window after an apply against the window before it. Pure.

KPIs (load-normalized where they can be): goodput under the SLO, P99 TTFT and E2E, generation tokens per second
per running request, and requests per second (the load itself). The rule, in order:
  * fewer than ``min_requests`` finished after the apply (llama-server counts no requests: fewer than that many
    generated tokens): too little traffic to judge -> kept, and said so;
  * goodput fell by more than 0.05 -> roll back;
  * tokens/s per running request fell below 0.8x -> roll back;
  * P99 TTFT or E2E rose above 1.25x + 50 ms -> roll back, unless the load itself changed by more than 2x
    either way (latency percentiles are not comparable across such a change; said so);
  * otherwise kept, with what improved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from tuner.signals.derive import TargetSignals
from tuner.store.window import TargetWindow

__all__ = ["Verdict", "kpis", "judge", "GOODPUT_DROP", "THROUGHPUT_FLOOR", "LATENCY_FACTOR", "LATENCY_SLACK_S",
           "LOAD_RATIO"]

GOODPUT_DROP = 0.05
THROUGHPUT_FLOOR = 0.8
LATENCY_FACTOR = 1.25
LATENCY_SLACK_S = 0.05
LOAD_RATIO = 2.0

_RUNNING = {"vllm": "vllm:num_requests_running", "llamacpp": "llamacpp:requests_processing"}


@dataclass(frozen=True)
class Verdict:
    outcome: str  # kept | rolled_back
    reason: str


def _mean_running(window: TargetWindow, backend: str) -> float | None:
    metric = _RUNNING.get(backend)
    values = [v for e in window.engines for (name, _), pts in e.series.items() if name == metric for _, v in pts]
    return math.fsum(values) / len(values) if values else None


def kpis(signals: TargetSignals, window: TargetWindow) -> dict[str, Any]:
    """The verdict's KPIs over one window, summed over engines (rates) or worst of them (latency, goodput)."""
    engines = [e for e in signals.engines if e.samples]

    def worst(attr: str, pick: Any) -> float | None:
        vals = [getattr(e, attr) for e in engines if getattr(e, attr) is not None]
        return pick(vals) if vals else None

    def total(attr: str) -> float | None:
        vals = [getattr(e, attr) for e in engines if getattr(e, attr) is not None]
        return math.fsum(vals) if vals else None

    gen = total("generation_tokens_per_s")
    running = _mean_running(window, signals.backend)
    return {"goodput_ratio": worst("goodput_ratio", min), "ttft_p99": worst("ttft_p99", max),
            "e2e_p99": worst("e2e_p99", max),
            "tokens_per_s_per_running": gen / running if gen is not None and running else None,
            "requests_per_s": total("requests_per_s"), "requests": total("requests_in_window"),
            "generated_tokens": gen * signals.window_s if gen is not None else None, "mean_running": running}


def _num(d: Mapping[str, Any], k: str) -> float | None:
    v = d.get(k)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def judge(before: Mapping[str, Any], after: Mapping[str, Any], *, min_requests: int) -> Verdict:
    n, unit = _num(after, "requests"), "requests finished"
    if n is None:
        n, unit = _num(after, "generated_tokens") or 0.0, "tokens generated (the server counts no requests)"
    if n < min_requests:
        return Verdict("kept", f"too little traffic to judge: {n:.0f} {unit} in the observation window "
                               f"(min_requests {min_requests}); kept")
    bad, good, notes, skipped = [], [], [], []
    g0, g1 = _num(before, "goodput_ratio"), _num(after, "goodput_ratio")
    if g0 is not None and g1 is not None:
        (bad if g1 < g0 - GOODPUT_DROP else good if g1 > g0 else notes).append(f"goodput {g0:.3f} -> {g1:.3f}")
    t0, t1 = _num(before, "tokens_per_s_per_running"), _num(after, "tokens_per_s_per_running")
    if t0 is not None and t1 is not None:
        (bad if t1 < THROUGHPUT_FLOOR * t0 else good if t1 > t0 else notes).append(
            f"tokens/s per running request {t0:.1f} -> {t1:.1f}")
    r0, r1 = _num(before, "requests_per_s"), _num(after, "requests_per_s")
    comparable = not (r0 and r1) or 1 / LOAD_RATIO <= r1 / r0 <= LOAD_RATIO
    for key, label in (("ttft_p99", "P99 TTFT"), ("e2e_p99", "P99 E2E")):
        a, b = _num(before, key), _num(after, key)
        if a is None or b is None:
            continue
        text = f"{label} {a:.3f}s -> {b:.3f}s"
        if not comparable:
            skipped.append(text)
        elif b > LATENCY_FACTOR * a + LATENCY_SLACK_S:
            bad.append(text)
        else:
            (good if b < a else notes).append(text)
    tail = f"; not compared, the load changed {r0:.2f} -> {r1:.2f} req/s: " + "; ".join(skipped) if skipped else ""
    if not (bad or good or notes):
        if skipped:
            return Verdict("kept", "nothing comparable regressed" + tail)
        return Verdict("kept", "no baseline KPIs to compare with (no traffic before the apply); kept")
    if bad:
        return Verdict("rolled_back", "regressed: " + "; ".join(bad) + (
            "; other: " + "; ".join(good + notes) if good or notes else "") + tail)
    return Verdict("kept", ("improved: " + "; ".join(good) if good else "no regression") + (
        "; within tolerance: " + "; ".join(notes) if notes else "") + tail)
