"""Two configs compared at one rate, interleaved: whether the candidate serves more or less within the SLO than the
flags in force, with its confidence, or "no difference measurable at this budget". Pure.

Capacities measured one after another, each on its own fresh server, differ by what the host did meanwhile (the
same flags measured 11.5, 19.3 and 54.6 req/s within 8 minutes on a busy host). So the winner is not recommended on
its sequential capacity alone: both servers are started fresh and run at the same rate in turns, A B B A A B ...
(the order alternates, so a load that drifts over the comparison weighs on both alike), every run with the same
number of requests. What a rate r decides: a config whose share within the SLO at r reaches the objective has a
capacity of at least r, one whose share falls short has less. At r where the two measurements predict different
outcomes (between the lowest rate A missed and the highest B met, their geometric mean; B's capacity when the two
intervals overlap):

  * B reaches the objective, A falls short, and B's share of misses is below A's beyond chance (Fisher's exact test,
    one-sided, on the pooled counts: CONFIDENT) -> ``b_better``: B's capacity exceeds r and A's does not;
  * the same the other way -> ``a_better``;
  * both reach it, over two pairs at least -> ``same``: both serve r, so the difference measured one after the
    other is not there when both run side by side;
  * otherwise another pair of runs, up to the budget; then ``undecided`` (both fell short, or the shares are
    within chance): no difference measurable at this budget.

Where both fall short at r, r is above both capacities and decides nothing between them, however far apart their
shares (the demo's comparison ran at 11.2 req/s, the candidate met the SLO for 88%, the flags in force for 20%, and
ended "no difference measurable"). So the rate moves (``TurnRate``): down to the geometric mean of r and the highest
rate both are known to serve (at first the lower of the two capacities one after the other; half of r when that is
0), and, once a rate both fell short of is known, up between a rate both met and it. Each rate's counts are pooled
apart: a decision is made from the runs at one rate.

Requests are not independent chances: those that arrive together queue together and meet or miss together, so a
side's misses come in clumps, and Fisher's test on the pooled requests would be as sure of a difference as if each
request had been drawn alone. Both sides' counts are divided by their design effect first (``design_effect`` of
both sides' runs at the rate: the variance their own batch-means errors measured, tuner/tune/bench.py, over the
binomial variance of the same counts; the first-order Rao-Scott correction, one effect for both since a side that
missed nothing shows no clumps to measure): misses in clumps of ten count about as many independent chances as
there were clumps. On identical configs with misses in clumps of ten (200 requests a side, objective 0.9), the
uncorrected test named a winner in 31-34% of comparisons, the corrected one in 1.8-4.5%
(tests/tune/test_compare.py).

How many requests a run needs follows from the objective (``min_requests``): a run exactly at the objective should
expect two misses, so that one unlucky request does not decide it. 30 requests judge 0.95 (1.5 misses expected);
a 0.99 objective needs 200 (one miss in 30 is 96.7%, a failure). Bursty arrivals need more (``burst_factor``):
requests that arrive in one burst queue together and meet or miss the SLO together, so a run holds about as many
independent chances as it holds bursts. Gamma gaps of shape k (vLLM's --burstiness) spread the count of arrivals in
a window 1/k times as widely as Poisson ones, so a run of bursty traffic sends 1/k times the requests (at most 5x).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "min_requests",
    "burst_factor",
    "MOST_BURST_FACTOR",
    "fisher_fewer_misses",
    "decide",
    "design_effect",
    "Decision",
    "TurnRate",
    "CONFIDENT",
    "EXPECTED_MISSES",
]

CONFIDENT = 0.95
EXPECTED_MISSES = 2  # misses a run exactly at the objective should expect
_MOST_REQUESTS = 2000  # an objective of 1 (no miss allowed) would ask for infinitely many
MOST_BURST_FACTOR = 5.0  # a run of bursty traffic is at most this many times as long as a Poisson one


def min_requests(objective: float, floor: int = 30) -> int:
    """Requests one run needs to judge ``objective``: EXPECTED_MISSES / (1 - objective), at least ``floor``."""
    if objective >= 1:
        return _MOST_REQUESTS
    return max(floor, min(_MOST_REQUESTS, math.ceil(EXPECTED_MISSES / (1 - objective) - 1e-9)))


def burst_factor(burstiness: float) -> float:
    """How many times the requests of a Poisson run a run of arrivals with gamma shape ``burstiness`` needs for as
    many independent chances: 1 / burstiness below 1 (at most MOST_BURST_FACTOR), 1 for Poisson or steadier."""
    if not burstiness > 0:
        return MOST_BURST_FACTOR
    return min(MOST_BURST_FACTOR, max(1.0, 1.0 / burstiness))


def fisher_fewer_misses(a_bad: int, a_n: int, b_bad: int, b_n: int) -> float:
    """One-sided p-value of Fisher's exact test that B's share of misses is below A's: the chance, with the misses
    spread at random over both (the margins fixed), that B would have had ``b_bad`` misses or fewer."""
    total, bad = a_n + b_n, a_bad + b_bad
    if total == 0:
        return 1.0
    denom = math.comb(total, b_n)
    p = 0
    for k in range(max(0, b_n - (total - bad)), min(b_bad, bad, b_n) + 1):
        p += math.comb(bad, k) * math.comb(total - bad, b_n - k)
    return min(1.0, p / denom)


def design_effect(runs: Iterable[Mapping[str, Any]]) -> float:
    """How many times the variance of a side's count within the SLO exceeds what independent requests would give,
    from its runs at one rate (each with ``good``, ``sent`` and the batch-means error of its share about the blocks'
    trend, ``attainment_se_detrended``, else ``attainment_se``): sum of (sent x se)^2 over the sum of the binomial
    sent x p x (1 - p), at least 1. A run without its own error counts as binomial; runs that missed nothing (or
    everything) have no variance either way. About the trend: a run above its capacity misses more as its queue
    grows, which its length decides, not chance (in a CI run of the demo the flags in force met 18/40 in turns, every
    request from the 17th on but two a miss: a design effect of 8.0 about the mean, 1 about the trend)."""
    measured = binomial = 0.0
    for r in runs:
        n, good = r.get("sent") or 0, r.get("good") or 0
        if n <= 0:
            continue
        p = good / n
        var = n * p * (1 - p)
        se = r.get("attainment_se_detrended", r.get("attainment_se"))
        binomial += var
        measured += (n * se) ** 2 if isinstance(se, (int, float)) and math.isfinite(se) else var
    return max(1.0, measured / binomial) if binomial > 0 else 1.0


def _effective(bad: int, n: int, deff: float) -> tuple[int, int]:
    """(misses, requests) as independent chances: both divided by the design effect, rounded (at least 1 request)."""
    if deff <= 1:
        return bad, n
    m = max(1, round(n / deff))
    return min(m, round(bad / deff)), m


@dataclass(frozen=True)
class Decision:
    outcome: str  # b_better | a_better | same | undecided
    confidence: float  # 1 - p of the test that decided (0 when none did)
    reason: str


def decide(
    objective: float,
    a_good: int,
    a_sent: int,
    b_good: int,
    b_sent: int,
    *,
    rate: float,
    final: bool,
    pairs: int = 1,
    confident: float = CONFIDENT,
    deff: float = 1.0,
) -> Decision:
    """The comparison so far at ``rate`` (A: the flags in force, B: the candidate) after ``pairs`` pairs of runs;
    ``final``: no more runs. Both meeting the objective decides only from the second pair on (or at the end): one
    run each at 40/40 says little of a 0.95 objective. ``deff``: the design effect of both sides' runs at the rate
    (``design_effect``): the test counts the requests of each as that many times fewer independent chances."""
    if a_sent <= 0 or b_sent <= 0:
        return Decision("undecided", 0.0, "no requests measured")
    pa, pb = a_good / a_sent, b_good / b_sent
    said = (
        f"at {rate:.3g} req/s the candidate met the SLO for {b_good}/{b_sent} ({pb:.1%}), the flags in force "
        f"for {a_good}/{a_sent} ({pa:.1%}), objective {objective:.1%}"
    )
    a_eff, b_eff = _effective(a_sent - a_good, a_sent, deff), _effective(b_sent - b_good, b_sent, deff)
    b_conf = 1 - fisher_fewer_misses(*a_eff, *b_eff)
    a_conf = 1 - fisher_fewer_misses(*b_eff, *a_eff)
    if deff > 1:
        said += (
            f" (misses came in clumps: counted as {b_eff[1]} and {a_eff[1]} independent requests, design effect"
            f" {deff:.2g})"
        )
    if pb >= objective > pa and b_conf >= confident:
        return Decision(
            "b_better",
            b_conf,
            f"{said}: the candidate serves more within the SLO (confidence {b_conf:.3f}, Fisher's exact test)",
        )
    if pa >= objective > pb and a_conf >= confident:
        return Decision(
            "a_better",
            a_conf,
            f"{said}: the flags in force serve more within the SLO (confidence {a_conf:.3f}, Fisher's exact test)",
        )
    if pa >= objective and pb >= objective and (pairs >= 2 or final):
        return Decision(
            "same",
            0.0,
            f"{said}: both serve it, so the difference measured one after the other did not hold side by side",
        )
    if not final:
        return Decision("undecided", max(a_conf, b_conf), said)
    why = (
        "both fell short of the objective"
        if pa < objective and pb < objective
        else f"the difference is within chance (confidence {max(a_conf, b_conf):.3f} < {confident})"
    )
    return Decision("undecided", max(a_conf, b_conf), f"{said}: {why}: no difference measurable at this budget")


@dataclass(frozen=True)
class TurnRate:
    """The rate a comparison in turns runs at, and what its runs so far bound: ``served``, the highest rate both
    configs are known to serve (at first the lower of their capacities one after the other; None when that is 0);
    ``missed``, the lowest rate both fell short of in turns (None until one did)."""

    rate: float
    served: float | None = None
    missed: float | None = None

    def after(self, objective: float, a_share: float, b_share: float) -> TurnRate:
        """Where the next pair runs, from the shares within the SLO pooled at ``rate``: on where one met the objective
        and the other did not (the rate separates them: more runs there decide); lower where both fell short; higher,
        towards a rate both missed, where both met. Both met and no such rate known: on (both serve it: ``decide``
        says so from the second pair)."""
        a_met, b_met = a_share >= objective, b_share >= objective
        if a_met != b_met:
            return self
        if not a_met:
            down = (
                math.sqrt(self.served * self.rate)
                if self.served is not None and 0 < self.served < self.rate
                else self.rate / 2
            )
            return TurnRate(down, self.served, self.rate)
        if self.missed is None or self.missed <= self.rate:
            return TurnRate(self.rate, self.rate, self.missed)
        return TurnRate(math.sqrt(self.rate * self.missed), self.rate, self.missed)
