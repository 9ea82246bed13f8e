"""Status and signals: what tuner sees of each target (and the GPUs) over a window of its store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.app.memory import EngineMemory, memory_of, server_pids
from tuner.app.session import Session
from tuner.apply.servers import flags_in_force
from tuner.collect.gpu import read_nvml
from tuner.config import Config, Target, replica_groups
from tuner.errors import TunerError
from tuner.signals.derive import SIGNAL_METRICS, TargetSignals, compute_signals, group_signals
from tuner.store import journal as jr
from tuner.store.journal import ApplyState
from tuner.store.store import GpuLatest, Store

__all__ = ["Status", "TargetStatus", "GroupStatus", "status", "signals", "group_signals_at"]


@dataclass(frozen=True)
class TargetStatus:
    target: Target
    signals: TargetSignals | None  # None: never scraped
    last_apply: jr.StoredApply | None = None  # the newest apply or rollback, finished or not
    memory: tuple[EngineMemory, ...] = ()  # vLLM: where each engine's memory goes (app/memory.py)

    def as_json(self) -> dict[str, Any]:
        a = self.last_apply
        return {
            **(
                self.signals.as_json()
                if self.signals
                else {"target": self.target.name, "backend": self.target.backend, "engines": []}
            ),
            "last_apply": None
            if a is None
            else {
                "id": a.id,
                "kind": a.kind,
                "state": a.state,
                "outcome": a.outcome,
                "diff": a.diff,
                "updated_ms": a.updated_ms,
            },
            "memory": [m.as_json() for m in self.memory],
        }


@dataclass(frozen=True)
class GroupStatus:
    """A replica group as a whole: what its replicas served together (signals/derive.py group_signals)."""

    name: str
    replicas: list[TargetStatus]
    signals: TargetSignals | None  # None: no replica scraped yet

    @property
    def up(self) -> int:
        return sum(1 for r in self.replicas if r.signals and r.signals.health and r.signals.health.health != "down")

    def as_json(self) -> dict[str, Any]:
        body = self.signals.as_json() if self.signals else {"target": self.name, "engines": []}
        return {**body, "group": self.name, "replicas": [r.target.name for r in self.replicas], "replicas_up": self.up}


@dataclass(frozen=True)
class Status:
    window_s: float
    targets: list[TargetStatus]
    gpus: list[GpuLatest]
    gpu_note: str  # why there is no GPU reading ("" when there is one)
    groups: list[GroupStatus]


def group_signals_at(store: Store, cfg: Config, group: str, *, window_s: float, at: float) -> TargetSignals | None:
    """The group's signals over the ``window_s`` before ``at`` from its replicas' windows (the same range for all);
    None when none of them has been scraped yet."""
    members = replica_groups(cfg.targets)[group]
    known = set(store.target_names())
    windows = [store.window(m.name, at - window_s, at, metrics=SIGNAL_METRICS) for m in members if m.name in known]
    return group_signals(group, windows, slo=members[0].slo) if windows else None


def _last_apply(store: Store, target: str) -> jr.StoredApply | None:
    """The newest apply or rollback of ``target``: a finished tuning run beside production changed nothing."""
    return next(
        (
            a
            for a in jr.list_applies(store.engine, target=target, limit=10)
            if not (a.mode == "shadow" and a.state == ApplyState.DONE)
        ),
        None,
    )


def status(session: Session, *, window_s: float, now: float) -> Status:
    store, cfg = session.store, session.cfg
    known = set(store.target_names())
    gpus = store.gpu_latest(max_age_s=max(60.0, 3 * cfg.gpu.interval.total_seconds()), now=now)
    rows = []
    for t in cfg.targets:
        last = _last_apply(store, t.name)
        if t.name not in known:
            rows.append(TargetStatus(t, None, last))
            continue
        window = store.window(t.name, now - window_s, now, metrics=SIGNAL_METRICS)
        memory = memory_of(t, window, gpus, pids=server_pids(store.engine, t), flags=flags_in_force(store.engine, t))
        rows.append(TargetStatus(t, compute_signals(window, slo=t.slo), last, tuple(memory)))
    note = ""
    if cfg.gpu.source == "none":
        note = "telemetry disabled (gpu.source: none)"
    elif not gpus:
        note = "no recent reading (is `tuner run` running?)"
        if cfg.gpu.source == "nvml":
            reading = read_nvml(now)  # cheap, and says why (no driver, no device) when there is no GPU
            note = note if reading.available else reading.reason
    by_name = {r.target.name: r for r in rows}
    groups = [
        GroupStatus(g, [by_name[m.name] for m in members], group_signals_at(store, cfg, g, window_s=window_s, at=now))
        for g, members in replica_groups(cfg.targets).items()
    ]
    return Status(window_s, rows, list(gpus), note, groups)


def signals(session: Session, target: str, *, window_s: float, at: float) -> TargetSignals:
    """A target's signals, or a replica group's (by the group's name: what its replicas served together)."""
    if target in replica_groups(session.cfg.targets):
        sig = group_signals_at(session.store, session.cfg, target, window_s=window_s, at=at)
        if sig is None:
            names = ", ".join(m.name for m in replica_groups(session.cfg.targets)[target])
            raise TunerError(
                f"group {target}: none of its replicas ({names}) has been scraped yet (is `tuner run` running?)"
            )
        return sig
    t = session.cfg.target(target)
    return compute_signals(session.store.window(t.name, at - window_s, at, metrics=SIGNAL_METRICS), slo=t.slo)
