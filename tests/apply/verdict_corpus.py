"""The verdict corpus (tests/fixtures/verdict_corpus/): its pairs, and the truth of each from the client side only.

A recording is a before side and an after side of a real server under real load (scripts/record_verdict_corpus.py).
Each vLLM recording is judged without an SLO and under every SLO its case.json names; a llama-server recording (the
server keeps no latency histogram) without one. A judged pair is (recording, SLO name or None).

The truth of a pair is read from what the clients measured, nothing the verdict computes: per request its send time,
time to first token, end-to-end latency, generated tokens and failure, restricted to the requests sent inside the
recorded window (the server's first to last kept scrape). From those, per side:

  offered     requests sent per second of the window
  served      requests (llama-server: generated tokens) finished inside the window, per second
  backlog     share of the requests sent in the window that had not finished when it ended: a queue that grows
              (open-loop arrivals above what the server sustains) leaves a backlog; below capacity only the requests
              in flight at the end are left (a few percent of a 40 s window)
  attainment  share of the requests sent in the window that met every budget (a failed one never does)
  p50 TTFT/E2E of the requests sent in the window that finished

and the rules, each a statement a person on call would make from those numbers:

  1. A trickle judges nothing: fewer than TRICKLE requests finished on a side -> inconclusive.
  2. The SLO first: before met and after breached beyond the binomial noise, the load not risen beyond LOAD_MATCH
     -> rolled_back; breached then met, the load not fallen beyond it -> kept. A decision is required only where the
     clients' evidence is clear (a one-sided two-proportion test at CLEAR, 0.99); a flip that is only just beyond
     the noise (0.95 to 0.99, e.g. 0 then 3 misses of 79) admits inconclusive beside the SLO's outcome, never the
     other one (the server's histograms see the same requests a little differently from the clients' clocks).
  3. The same flags restarted are never rolled back.
  4. A large effect decides: saturated on both sides (backlog on both), served x1.3 or more -> kept, x0.77 or less
     -> rolled_back; a queue appeared at the same load and the new flags serve 0.7x or less of what the old ones were
     offered -> rolled_back.
  5. No verdict contradicts the clients: no rolled_back when nothing the clients measured got worse (served, with a
     backlog on both sides, down 10%; attainment down beyond the noise; a p50 up 25% at no more load; a backlog
     appearing), no kept when something got worse and nothing got better.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from tuner.apply.verdict import Verdict

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "verdict_corpus"
OUTCOMES = frozenset({"kept", "rolled_back", "inconclusive"})
LOAD_MATCH = 1.25
TRICKLE = 15  # finished requests a side below which nothing can be judged (the verdict's min_requests is 20)
BACKLOG = 0.15  # a backlog share above this: the queue grew over the window
Z95 = 1.959964
CLEAR = 0.99  # how sure the clients' numbers must be before a decision is required of the verdict


@dataclass(frozen=True)
class Pair:
    recording: str
    slo: str | None
    held_back: bool

    @property
    def id(self) -> str:
        return f"{self.recording}-{self.slo or 'no_slo'}" + ("-held" if self.held_back else "")


@dataclass(frozen=True)
class Side:
    offered: float
    served: float
    backlog: float
    finished: int
    sent: int
    attainment: float | None
    ttft_p50: float | None
    e2e_p50: float | None
    window_s: float


def held_back() -> set[str]:
    return set(json.loads((CORPUS / "held_back.json").read_text())["held_back"])


def recordings() -> list[str]:
    return sorted(p.name for p in CORPUS.iterdir() if (p / "case.json").exists()) if CORPUS.exists() else []


def meta(recording: str) -> dict[str, Any]:
    return dict(json.loads((CORPUS / recording / "case.json").read_text()))


def pairs() -> list[Pair]:
    held = held_back()
    out = []
    for rec in recordings():
        slos = [None, *sorted(meta(rec).get("slos") or {})]
        out += [Pair(rec, s, rec in held) for s in slos]
    return out


def window(recording: str, side: str) -> tuple[float, float]:
    stamps = sorted(int(p.name.split(".")[0]) for p in (CORPUS / recording / side).glob("*.txt.gz"))
    return stamps[0] / 1000, stamps[-1] / 1000


def side_facts(recording: str, side: str, slo: dict[str, float] | None) -> Side:
    m = meta(recording)
    t0, t1 = window(recording, side)
    reqs = [r for r in m[side]["client"]["requests"] if t0 <= r["sent"] <= t1]
    secs = t1 - t0
    done = [r for r in reqs if not r["failed"]]
    finished_in = [r for r in done if r["sent"] + r["e2e"] <= t1]
    if m["backend"] == "vllm":
        served = len(finished_in) / secs
    else:
        served = sum(r["tokens"] for r in finished_in) / secs
    attainment = None
    if slo is not None and reqs:
        good = sum(
            1 for r in done if r["ttft"] <= slo.get("ttft_p99", math.inf) and r["e2e"] <= slo.get("e2e_p99", math.inf)
        )
        attainment = good / len(reqs)
    return Side(
        offered=len(reqs) / secs,
        served=served,
        backlog=1 - len(finished_in) / len(reqs) if reqs else 0.0,
        finished=len(finished_in),
        sent=len(reqs),
        attainment=attainment,
        ttft_p50=median(r["ttft"] for r in done) if done else None,
        e2e_p50=median(r["e2e"] for r in done) if done else None,
        window_s=secs,
    )


def wilson(p: float, n: int) -> tuple[float, float]:
    if n <= 0:
        return 0.0, 1.0
    denom = 1 + Z95 * Z95 / n
    centre = (p + Z95 * Z95 / (2 * n)) / denom
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 * Z95 / (4 * n * n)) / denom
    return centre - half, centre + half


def _status(p: float, n: int, objective: float) -> str:
    return "met" if p >= objective else "breached" if wilson(p, n)[1] < objective else "unsure"


def _p_fell(pb: float, nb: int, pa: float, na: int) -> float:
    """One-sided two-proportion z-test: how sure the numbers are that the share fell from pb (of nb) to pa."""
    pooled = (pb * nb + pa * na) / (nb + na)
    se = math.sqrt(pooled * (1 - pooled) * (1 / nb + 1 / na))
    if se == 0:
        return 1.0 if pa < pb else 0.0 if pa > pb else 0.5
    return 0.5 * (1 + math.erf((pb - pa) / se / math.sqrt(2)))


def _fell_beyond_noise(pb: float, nb: int, pa: float, na: int) -> bool:
    return _p_fell(pb, nb, pa, na) >= 0.95


def truth(pair: Pair) -> tuple[frozenset[str], str]:
    """The outcomes the clients' facts allow for this pair, and why (the rule that set them)."""
    m = meta(pair.recording)
    slo = (m.get("slos") or {}).get(pair.slo) if pair.slo else None
    objective = slo.get("objective", 0.99) if slo else 0.99
    b, a = side_facts(pair.recording, "before", slo), side_facts(pair.recording, "after", slo)
    facts = (
        f"offered {b.offered:.2f} -> {a.offered:.2f}, served {b.served:.2f} -> {a.served:.2f}, backlog "
        f"{b.backlog:.0%} -> {a.backlog:.0%}, finished {b.finished} -> {a.finished}"
    )
    if min(b.finished, a.finished) < TRICKLE:
        return frozenset({"inconclusive"}), f"rule 1 (a trickle): {facts}"
    ratio = a.offered / b.offered if b.offered else math.inf
    if slo is not None and b.attainment is not None and a.attainment is not None:
        sb, sa = _status(b.attainment, b.sent, objective), _status(a.attainment, a.sent, objective)
        facts += f", attainment {b.attainment:.1%} ({sb}) -> {a.attainment:.1%} ({sa})"
        fell, rose = (
            _p_fell(b.attainment, b.sent, a.attainment, a.sent),
            _p_fell(a.attainment, a.sent, b.attainment, b.sent),
        )
        if sb == "met" and sa == "breached" and fell >= 0.95 and ratio <= LOAD_MATCH:
            if fell >= CLEAR:
                return frozenset({"rolled_back"}), f"rule 2 (the SLO broke): {facts}"
            return frozenset(
                {"rolled_back", "inconclusive"}
            ), f"rule 2 (the SLO broke, just beyond the noise: P {fell:.3f}): {facts}"
        if sb == "breached" and sa == "met" and rose >= 0.95 and ratio >= 1 / LOAD_MATCH:
            if rose >= CLEAR:
                return frozenset({"kept"}), f"rule 2 (the SLO was cured): {facts}"
            return frozenset(
                {"kept", "inconclusive"}
            ), f"rule 2 (the SLO was cured, just beyond the noise: P {rose:.3f}): {facts}"
    same_flags = m["before"]["flags"] == m["after"]["flags"]
    sat_b, sat_a = b.backlog >= BACKLOG, a.backlog >= BACKLOG
    served = a.served / b.served if b.served else math.inf
    if not same_flags:
        if sat_b and sat_a and served >= 1.3:
            return frozenset({"kept"}), f"rule 4 (capacity up by {served - 1:.0%}, saturated on both sides): {facts}"
        if sat_b and sat_a and served <= 0.77:
            return frozenset({"rolled_back"}), f"rule 4 (capacity down by {1 - served:.0%}): {facts}"
        if not sat_b and sat_a and ratio <= LOAD_MATCH and a.served <= 0.7 * b.offered:
            return frozenset(
                {"rolled_back"}
            ), f"rule 4 (a queue appeared, {a.served / b.offered:.0%} of the load served): {facts}"
    worse, better = [], []
    if sat_b and sat_a:
        (worse if served <= 0.9 else better if served >= 1.1 else []).append("served")
    if not sat_b and sat_a and ratio <= LOAD_MATCH:
        worse.append("a backlog appeared")
    if sat_b and not sat_a and a.served >= 0.85 * b.served:
        better.append("the backlog went")
    if slo is not None and b.attainment is not None and a.attainment is not None:
        if _fell_beyond_noise(b.attainment, b.sent, a.attainment, a.sent):
            worse.append("attainment")
        if _fell_beyond_noise(a.attainment, a.sent, b.attainment, b.sent):
            better.append("attainment")
    for name, vb, va in (("TTFT p50", b.ttft_p50, a.ttft_p50), ("E2E p50", b.e2e_p50, a.e2e_p50)):
        if vb and va and not sat_b and not sat_a:
            if va >= 1.25 * vb and ratio <= LOAD_MATCH:
                worse.append(name)
            if va <= vb / 1.25 and ratio >= 1 / LOAD_MATCH:
                better.append(name)
    allowed = set(OUTCOMES)
    why = []
    if same_flags:
        allowed.discard("rolled_back")
        why.append("rule 3 (the same flags)")
    if not worse:
        allowed.discard("rolled_back")
        why.append("rule 5 (nothing got worse)")
    if worse and not better:
        allowed.discard("kept")
        why.append(f"rule 5 (worse: {', '.join(worse)})")
    return frozenset(allowed), f"{'; '.join(why) or 'no rule binds'}: {facts}"


def clauses_contradicting_their_numbers(v: Verdict) -> list[str]:
    """Each clause whose word its own numbers deny (tests/apply/test_verdict.py holds the same over generated data)."""
    bad = []
    for c in v.clauses:
        b, a = c.before, c.after
        if c.word in ("rose", "fell") and (b is None or a is None or (c.word == "rose") != (a > b)):
            bad.append(c.text)
        if c.kind == "load" and c.word == "held" and b and a is not None and abs(a / b - 1) > 0.05 + 1e-9:
            bad.append(c.text)
        if c.kind == "queue" and (
            c.word in ("appeared", "stayed")
            and not v.after.get("saturated")
            or c.word in ("gone", "none")
            and v.after.get("saturated")
            or c.word in ("gone", "stayed")
            and not v.before.get("saturated")
            or c.word in ("appeared", "none")
            and v.before.get("saturated")
        ):
            bad.append(c.text)
        if c.kind == "slo" and v.slo is not None and (c.word == "broke") != v.slo.broke:
            bad.append(c.text)
        if c.text not in v.reason:
            bad.append(f"not in the reason: {c.text}")
    return bad
