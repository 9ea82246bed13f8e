"""Auto mode's guardrails, pure: given the journal and the proposals, may tuner apply one now, and which?

A target in auto mode gets a recommendation applied only when all hold:
  * no apply is open on it, nor on another target that shares one of its GPUs;
  * it is inside a maintenance window (when any are configured);
  * the cooldown since its last finished apply has passed;
  * fewer than ``max_restarts_per_hour`` server starts in the last hour (rollbacks count: they start it again);
  * fewer than ``max_consecutive_rollbacks`` auto applies in a row rolled back or failed in the last 24 hours
    (then auto mode halts for the target, and tuner raises the AutoApplyHalted alert);
  * some proposal reaches ``min_confidence``: the best rank, then the highest confidence, is taken;
  * and it does not lead to a flag set that an earlier apply of the target rolled back under the load there is now:
    a rolled-back set is remembered, with the offered load its verdict was judged under (the apply's baseline), and
    proposed again only once the load has moved beyond LOAD_MATCH from that (or when nothing says what it was).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.apply.verdict import LOAD_MATCH
from tuner.config import Window, in_window, parse_window
from tuner.store.journal import ApplyOutcome, ApplyState, ApplyStep, StoredApply, new_flags_stand
from tuner.store.recommendations import StoredRecommendation

__all__ = [
    "Window",
    "parse_window",
    "in_window",
    "Decision",
    "decide",
    "halted",
    "rollback_streak",
    "rolled_back_under",
    "HALT_PERIOD_S",
    "applies_last_hour",
    "flag_flips",
    "FLIP_PERIOD_S",
]

HALT_PERIOD_S = 24 * 3600
FLIP_PERIOD_S = 24 * 3600


@dataclass(frozen=True)
class Decision:
    go: bool
    reason: str
    recommendation: StoredRecommendation | None = None
    halted: bool = False  # auto mode stopped by the rollback streak


def rollback_streak(history: Sequence[StoredApply], now: float) -> int:
    """Auto applies in a row (newest first) that rolled back or failed within HALT_PERIOD_S; a kept apply ends it."""
    n = 0
    for a in history:  # newest first
        if a.state != ApplyState.DONE or a.kind != "apply":
            continue
        if a.outcome == ApplyOutcome.KEPT or a.updated_ms < (now - HALT_PERIOD_S) * 1000:
            break
        if a.mode == "auto":
            n += 1
    return n


def halted(history: Sequence[StoredApply], now: float, limit: int) -> bool:
    """Whether auto mode stands halted: ``limit`` auto applies in a row rolled back or failed (see rollback_streak).
    The one definition that the guardrails, the exporter's tuner_auto_apply_halted and the alert rule read."""
    return rollback_streak(history, now) >= limit


def applies_last_hour(history: Sequence[StoredApply], now: float) -> int:
    """Applies, canaries, rollbacks and restarts begun on the target in the hour before ``now`` (tuner's
    ``tuner_applies_last_hour``, the ApplyThrashing rule's signal)."""
    since = (now - 3600) * 1000
    return sum(1 for a in history if a.created_ms >= since)


def _in_force_after(a: StoredApply) -> Mapping[str, Any]:
    """The flags a finished journal entry left in force."""
    if a.kind in ("apply", "canary"):
        return a.new_flags if new_flags_stand(a) else a.old_flags
    if a.kind == "rollback":
        return a.new_flags if a.outcome == ApplyOutcome.ROLLED_BACK else a.old_flags  # a rollback that went through
    return a.old_flags  # a restart: the same flags


def flag_flips(history: Sequence[StoredApply], now: float, period_s: float = FLIP_PERIOD_S) -> int:
    """Times within ``period_s`` before ``now`` that a flag in force went back to the value it had before its last
    change (A -> B -> A is one, A -> B -> A -> B two), over the finished entries of the target's journal, oldest
    first (tuner's ``tuner_apply_flag_flips``, the FlagFlapping rule's signal). An apply that was rolled back left
    nothing in force: it is no flip."""
    since = (now - period_s) * 1000
    values: dict[str, list[str | None]] = {}  # flag -> the values it took, each different from the one before
    flips = 0
    for a in sorted((a for a in history if a.state == ApplyState.DONE and a.updated_ms >= since), key=lambda a: a.id):
        before, after = _norm(a.old_flags), _norm(_in_force_after(a))
        for flag in sorted(set(before) | set(after)):
            seen = values.setdefault(flag, [before.get(flag)])
            for v in (before.get(flag), after.get(flag, before.get(flag))):  # a change tuner did not make counts too
                if v != seen[-1]:
                    flips += len(seen) >= 2 and v == seen[-2]
                    seen.append(v)
    return flips


def _norm(flags: Mapping[str, Any]) -> dict[str, str]:
    return {str(k).replace("-", "_"): str(v).lower() for k, v in flags.items()}


def _judged_load(a: StoredApply) -> float | None:
    """The offered load an apply's verdict was judged under: its baseline's (llama-server: generated tokens/s)."""
    for key in ("offered_rps", "tokens_per_s"):
        v = a.baseline.get(key)
        if isinstance(v, (int, float)) and v > 0:
            return float(v)
    return None


def rolled_back_under(
    history: Sequence[StoredApply], flags: Mapping[str, Any], load_now: float | None
) -> StoredApply | None:
    """The newest apply that rolled back to leave ``flags`` under a load like ``load_now`` (within LOAD_MATCH; an
    unknown load on either side counts as the same), else None."""
    want = _norm(flags)
    for a in history:  # newest first
        if (
            a.state != ApplyState.DONE
            or a.kind not in ("apply", "canary")
            or a.outcome != ApplyOutcome.ROLLED_BACK
            or _norm(a.new_flags) != want
        ):
            continue
        judged = _judged_load(a)
        if judged is None or load_now is None or 1 / LOAD_MATCH <= load_now / judged <= LOAD_MATCH:
            return a
    return None


def _starts(history: Iterable[StoredApply], since_ms: float) -> int:
    return sum(
        1
        for a in history
        for s in a.steps
        if s["step"] in (ApplyStep.STARTING, ApplyStep.RESTORING) and s["ts_ms"] >= since_ms
    )


def decide(
    *,
    now: float,
    policy: object,
    history: Sequence[StoredApply],
    proposals: Sequence[StoredRecommendation],
    gpus: Iterable[int] = (),
    busy_gpus: Iterable[int] = (),
    flags_now: Mapping[str, Any] | None = None,
    load_now: float | None = None,
) -> Decision:
    """history: this target's applies, newest first. busy_gpus: GPUs of other targets with an open apply.
    flags_now, load_now: the flags in force and the offered load now (for the rolled-back memory)."""
    open_now = [a for a in history if a.state != ApplyState.DONE]
    if open_now:
        return Decision(False, f"apply #{open_now[0].id} is in progress")
    shared = sorted(set(gpus) & set(busy_gpus))
    if shared:
        return Decision(False, f"another server on GPU {','.join(map(str, shared))} is being applied")
    streak = rollback_streak(history, now)
    limit = policy.max_consecutive_rollbacks  # type: ignore[attr-defined]
    if halted(history, now, limit):
        return Decision(
            False,
            f"auto mode halted: the last {streak} auto applies rolled back or failed (limit "
            f"{limit}); apply one by hand, or it resumes 24 h after the last",
            halted=True,
        )
    windows = [parse_window(w) for w in policy.maintenance_windows]  # type: ignore[attr-defined]
    if windows and not any(in_window(w, now) for w in windows):
        return Decision(False, "outside the maintenance windows")
    done = [a for a in history if a.state == ApplyState.DONE]
    cooldown_s = policy.cooldown.total_seconds()  # type: ignore[attr-defined]
    if done and now * 1000 - done[0].updated_ms < cooldown_s * 1000:
        left = cooldown_s - (now * 1000 - done[0].updated_ms) / 1000
        return Decision(False, f"cooldown: {left:.0f}s left after apply #{done[0].id}")
    starts = _starts(history, (now - 3600) * 1000)
    if starts >= policy.max_restarts_per_hour:  # type: ignore[attr-defined]
        return Decision(
            False,
            f"{starts} server starts in the last hour (max_restarts_per_hour {policy.max_restarts_per_hour})",  # type: ignore[attr-defined]
        )
    bar = policy.min_confidence  # type: ignore[attr-defined]
    # a backend change is a migration to another server, never applied (Applier.plan refuses it): were it taken
    # here, every auto tick would pick it and fail again instead of the flag changes behind it
    good = [r for r in proposals if r.status == "proposed" and r.confidence >= bar and "backend" not in r.diff]
    if not good:
        return Decision(False, f"no flag change reaches confidence {bar:g}" if proposals else "nothing proposed")
    remembered = []
    if flags_now is not None:
        for r in list(good):
            undone = rolled_back_under(history, {**flags_now, **r.diff}, load_now)
            if undone is not None:
                good.remove(r)
                judged = _judged_load(undone)
                remembered.append(
                    f"#{r.id} leads to the flags apply #{undone.id} rolled back under "
                    f"{'an unknown load' if judged is None else format(judged, '.3g')} (now "
                    f"{'unknown' if load_now is None else format(load_now, '.3g')}; proposed again "
                    f"once the load moves beyond {LOAD_MATCH:g}x)"
                )
    if not good:
        return Decision(False, "; ".join(remembered))
    best = min(good, key=lambda r: (r.rank, -r.confidence, r.id))
    return Decision(True, f"#{best.id} (rank {best.rank}, confidence {best.confidence:.2f})", best)
