"""What an apply sees of the server's load before and after it: the windows' profiles, the observation that waits
for a verdict, and what a switch cost the clients.

Everything here reads the store (the data ``tuner run`` scraped) through the ``Steps`` port; the verdict itself is
pure (verdict.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuner.apply import managed as mg
from tuner.apply.port import Steps
from tuner.apply.routes import route_for
from tuner.apply.verdict import MIN_SCRAPES, Verdict, judge
from tuner.config import Target
from tuner.signals.load import LoadProfile, group_profile, profile
from tuner.store import journal as jr
from tuner.store.journal import ApplyOutcome, ApplyState, ApplyStep

__all__ = ["Observer", "cost", "outage"]

_OBSERVE_POLL_S = 1.0


def outage(a: jr.StoredApply) -> float | None:
    """Seconds from the start of the drain until the new server passed its health gate."""
    ts: dict[str, int] = {}
    for st in a.steps:
        ts.setdefault(st["step"], st["ts_ms"])
    if ApplyStep.DRAINING in ts and ApplyStep.HEALTHY in ts and ts[ApplyStep.HEALTHY] >= ts[ApplyStep.DRAINING]:
        return (ts[ApplyStep.HEALTHY] - ts[ApplyStep.DRAINING]) / 1000
    return None


def cost(a: jr.StoredApply, base: dict[str, Any]) -> dict[str, Any]:
    """What the apply cost the clients, as far as the server side shows it (the journal's ``after``).

    ``outage_s``: drain start -> health gate passed, no new request served. ``arrivals_during_outage``: the
    baseline's offered load times the outage, an estimate of the requests that reached a server that was not
    serving: refused, or sent again by clients that retry; which of the two, only the clients (or a load
    balancer in front) can tell. The baseline holds ``in_flight_at_drain``, read from the server's /metrics
    just before the drain: vLLM finishes those within --shutdown-timeout, llama-server is drained idle first.
    """
    out: dict[str, Any] = {}
    seconds = outage(a)
    if seconds is not None:
        out["outage_s"] = round(seconds, 1)
        offered = base.get("offered_rps")
        if isinstance(offered, (int, float)):
            out["arrivals_during_outage"] = round(offered * seconds, 1)
    return out


@dataclass
class Observer:
    """Windows of a target's stored data, and the observation after a switch, for the flow ``steps``."""

    steps: Steps

    def members(self, t: Target, start: float, end: float, group: bool) -> list[str]:
        """The targets whose data make up ``t``'s in [start, end]: itself, or its group's replicas that served then."""
        return route_for(t).replicas(self.steps, t, start, end) if group else [t.name]

    def served(self, t: Target, names: list[str], start: float, end: float) -> LoadProfile | None:
        """What the targets ``names`` (``t`` or replicas of its group) served in [start, end], together."""
        store = self.steps.store
        scraped = store.target_names()
        if not names or any(n not in scraped for n in names):
            return None  # never scraped (no `tuner run` yet): nothing to judge with
        if len(names) == 1:
            return profile(store.window(names[0], start, end), slo=t.slo)
        return group_profile(t.group or t.name, [store.window(n, start, end) for n in names], slo=t.slo)

    def profile(self, t: Target, start: float, end: float, *, group: bool = False) -> LoadProfile | None:
        """What ``t`` served in [start, end]; with ``group``, what its whole replica group served (every replica
        must have been scraped)."""
        return self.served(t, self.members(t, start, end, group), start, end)

    def baseline(self, aid: int, t: Target, *, group: bool, wait: bool) -> dict[str, Any]:
        """The window before the change (apply.baseline long, ending now), as the verdict will read it.

        With ``wait`` (the change restarts the server and an undecided verdict would undo it): a window that held
        traffic but fewer than MIN_SCRAPES stored scrapes (a loaded server answers /metrics late; a busy daemon
        folds late scrapes) cannot be judged, so changing now buys a restart and its rollback for nothing. The
        apply waits, a scrape interval at a time and at most one more baseline window, for a window it can judge,
        and changes the server either way (the verdict then says what it lacked)."""
        span = t.apply.baseline.total_seconds()
        step = max(1.0, self.steps.cfg.interval(t).total_seconds())
        tries = int(span // step) + 1 if wait else 0
        for i in range(tries):
            now = self.steps.clock()
            base = self.kpis(t, now - span, now, group=group)
            samples = base.get("samples") or 0
            if samples >= MIN_SCRAPES or not base.get("finished"):
                return base
            if i == 0:
                self.steps.step(
                    aid,
                    ApplyStep.BASELINE_WAIT,
                    f"the last {span:g}s hold {samples} stored scrapes, the verdict needs {MIN_SCRAPES}: waiting up "
                    f"to {tries * step:g}s for a window it can judge",
                )
            self.steps.sleep(step)
        now = self.steps.clock()
        return self.kpis(t, now - span, now, group=group)  # the window as it is now, judgeable or not

    def kpis(self, t: Target, start: float, end: float, *, group: bool = False) -> dict[str, Any]:
        """The window's load profile for the journal, with the window itself so the verdict can read it again."""
        names = self.members(t, start, end, group)
        prof = self.served(t, names, start, end)
        scope = {"group": t.group, "replicas": names} if group and t.group else {}
        return {"window": [start, end], **scope, **(prof.summary() if prof else {})}

    def kpis_of(self, t: Target, names: list[str], start: float, end: float) -> dict[str, Any]:
        """The journal's KPIs of a canary's or a control's targets over one window."""
        prof = self.served(t, names, start, end)
        return {
            "window": [start, end],
            **({"replicas": names} if names != [t.name] else {}),
            **(prof.summary() if prof else {}),
        }

    def judge_windows(
        self, t: Target, before: tuple[float, float], after: tuple[float, float], *, group: bool = False
    ) -> Verdict:
        """The verdict on two windows of a target's stored data (what `tuner judge TARGET` prints); with
        ``group``, of its whole replica group's (a rolling apply changes every replica: the group is judged)."""
        return judge(
            self.profile(t, *before, group=group),
            self.profile(t, *after, group=group),
            min_requests=t.apply.min_requests,
        )

    def expected_outage(self, t: Target) -> tuple[float, int] | None:
        """(median outage in seconds, how many earlier applies it is from) for this target, if any."""
        seen = sorted(
            o for a in jr.list_applies(self.steps.engine, target=t.name, limit=50) if (o := outage(a)) is not None
        )
        return (seen[len(seen) // 2], len(seen)) if seen else None

    def watch(self, t: Target, seconds: float) -> str | None:
        """Sleep through the observation; the server's error line if a managed server dies meanwhile."""
        clock, sleep = self.steps.clock, self.steps.sleep
        deadline = clock() + seconds
        while clock() < deadline:
            if t.managed is not None and self.steps.running(t) is None:
                return mg.error_line(mg.log_path(t, self.steps.config_dir))
            sleep(min(_OBSERVE_POLL_S, max(0.0, deadline - clock())))
        return None

    def observe(
        self, aid: int, t: Target, what: str, verdict: Callable[[float, float], Verdict]
    ) -> tuple[str | None, Verdict | None, float, float]:
        """Watch ``t`` for apply.observe, and on (up to observe_max, else 3x) while ``verdict(t0, now)`` is
        inconclusive: (the server's error line if it died meanwhile, the last verdict, t0, now)."""
        clock = self.steps.clock
        observe_s = t.apply.observe.total_seconds()
        limit_s = t.apply.observe_max.total_seconds() if t.apply.observe_max else 3 * observe_s
        self.steps.step(
            aid,
            ApplyStep.OBSERVING,
            f"{what}{observe_s:g}s (up to {limit_s:g}s while inconclusive)",
            state=ApplyState.OBSERVING,
        )
        t0 = clock()
        v: Verdict | None = None
        while True:
            died = self.watch(t, min(observe_s, t0 + limit_s - clock()))
            now = clock()
            if died:
                return died, v, t0, now
            v = verdict(t0, now)
            if v.outcome != ApplyOutcome.INCONCLUSIVE or now - t0 >= limit_s - 0.5:
                return None, v, t0, now
            self.steps.step(aid, ApplyStep.OBSERVING, f"inconclusive after {now - t0:.0f}s ({v.reason}); observing on")
