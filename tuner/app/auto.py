"""Auto mode, one step for one target: refresh its recommendations, ask the guardrails, apply the best if they
allow. The daemon runs this every ``apply.auto_interval``; iterated, it is the live loop (recommend -> apply ->
verdict) that converges (bench/converge.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tuner.app.recommend import RecommendRequest, recommend
from tuner.apply.flow import Applier
from tuner.apply.guard import Decision, decide
from tuner.config import Config, Target
from tuner.signals.load import profile
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store.store import Store

__all__ = ["AutoStep", "auto_step"]


@dataclass(frozen=True)
class AutoStep:
    decision: Decision
    applied: jr.StoredApply | None  # the apply it ran, when the guardrails let it


def _load_now(store: Store, target: Target, now: float) -> float | None:
    """The offered load over the target's baseline window (llama-server: generated tokens/s), as an apply's
    baseline records it: what a remembered rollback is compared with."""
    if target.name not in store.target_names():
        return None
    p = profile(store.window(target.name, now - target.apply.baseline.total_seconds(), now), slo=target.slo)
    return None if p is None else p.offered


def auto_step(
    cfg: Config,
    store: Store,
    applier: Applier,
    target: Target,
    *,
    now: float,
    decided: Callable[[Decision], None] = lambda d: None,
) -> AutoStep:
    """``decided`` hears the guardrails' decision before an apply starts (an apply takes minutes)."""
    applier.reconcile()
    flags = applier.flags_in_force(target)  # read once: the advisor and the guardrails see the same flags
    # (a managed target's model is read by recommend itself)
    recommend(cfg, store, RecommendRequest(target.name, target.apply.baseline.total_seconds(), in_force=flags), now)
    # a GPU shared with another managed target that is mid-apply is not restarted under it
    busy = {
        g
        for t in cfg.targets
        if t.name != target.name and t.managed and jr.open_applies_for(store.engine, t.name)
        for g in t.managed.gpus
    }
    d = decide(
        now=now,
        policy=target.apply,
        history=jr.list_applies(store.engine, target=target.name, limit=50),
        proposals=recs.proposed_for(store.engine, target.name),
        gpus=target.managed.gpus if target.managed else (),
        busy_gpus=busy,
        flags_now=flags,
        load_now=_load_now(store, target, now),
    )
    decided(d)
    if not d.go or d.recommendation is None:
        return AutoStep(d, None)
    return AutoStep(d, applier.apply(d.recommendation.id, mode="auto"))
