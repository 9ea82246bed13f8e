"""Status and signals: what tuner sees of each target (and the GPUs) over a window of its store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.app.session import Session
from tuner.collect.gpu import read_nvml
from tuner.config import Target
from tuner.signals.derive import SIGNAL_METRICS, TargetSignals, compute_signals
from tuner.store import journal as jr
from tuner.store.store import GpuLatest

__all__ = ["Status", "TargetStatus", "status", "signals"]


@dataclass(frozen=True)
class TargetStatus:
    target: Target
    signals: TargetSignals | None  # None: never scraped
    last_apply: jr.StoredApply | None = None  # the newest apply or rollback, finished or not

    def as_json(self) -> dict[str, Any]:
        a = self.last_apply
        return {**(self.signals.as_json() if self.signals else {"target": self.target.name,
                                                                 "backend": self.target.backend, "engines": []}),
                "last_apply": None if a is None else {"id": a.id, "kind": a.kind, "state": a.state,
                                                       "outcome": a.outcome, "diff": a.diff,
                                                       "updated_ms": a.updated_ms}}


@dataclass(frozen=True)
class Status:
    window_s: float
    targets: list[TargetStatus]
    gpus: list[GpuLatest]
    gpu_note: str  # why there is no GPU reading ("" when there is one)


def status(session: Session, *, window_s: float, now: float) -> Status:
    store, cfg = session.store, session.cfg
    known = set(store.target_names())
    rows = [TargetStatus(t, compute_signals(store.window(t.name, now - window_s, now, metrics=SIGNAL_METRICS),
                                            slo=t.slo) if t.name in known else None,
                         next(iter(jr.list_applies(store.engine, target=t.name, limit=1)), None))
            for t in cfg.targets]
    gpus = store.gpu_latest(max_age_s=max(60.0, 3 * cfg.gpu.interval.total_seconds()), now=now)
    note = ""
    if cfg.gpu.source == "none":
        note = "telemetry disabled (gpu.source: none)"
    elif not gpus:
        note = "no recent reading (is `tuner run` running?)"
        if cfg.gpu.source == "nvml":
            reading = read_nvml(now)  # cheap, and says why (no driver, no device) when there is no GPU
            note = note if reading.available else reading.reason
    return Status(window_s, rows, list(gpus), note)


def signals(session: Session, target: str, *, window_s: float, at: float) -> TargetSignals:
    t = session.cfg.target(target)
    return compute_signals(session.store.window(t.name, at - window_s, at, metrics=SIGNAL_METRICS), slo=t.slo)
