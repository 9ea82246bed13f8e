"""What the daemon holds between ticks, for its listener (/metrics, /api/v1) and the CLI to read."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from tuner.app.alerting import Alerting
from tuner.app.memory import EngineMemory
from tuner.collect.snapshots import GpuReading
from tuner.config import Target
from tuner.signals.derive import TargetSignals

__all__ = ["DaemonState"]


@dataclass
class DaemonState:
    """What the exporter and the CLI read: latest signals per target, latest GPU reading, job errors."""

    signals: dict[str, TargetSignals] = field(default_factory=dict)
    gpu: GpuReading | None = None
    scrapes_total: dict[str, int] = field(default_factory=dict)
    scrape_failures_total: dict[str, int] = field(default_factory=dict)
    last_duration_s: dict[str, float] = field(default_factory=dict)
    job_errors: dict[str, str] = field(default_factory=dict)  # job name -> last error ("" when fine)
    targets: dict[str, Target] = field(default_factory=dict)
    alerting: Alerting | None = None
    # apply side, refreshed by the apply-status job: (target, status) -> recommendations; (target, outcome) ->
    # finished applies; target -> managed server up; target -> auto mode halted; target -> last auto decision
    recommendations: dict[tuple[str, str], int] = field(default_factory=dict)
    applies: dict[tuple[str, str], int] = field(default_factory=dict)
    managed_up: dict[str, bool] = field(default_factory=dict)
    auto_halted: dict[str, bool] = field(default_factory=dict)
    auto_decision: dict[str, str] = field(default_factory=dict)
    max_num_seqs: dict[str, float] = field(default_factory=dict)  # target -> the max-num-seqs in force (vLLM)
    # tuner's own loop: target -> applies begun in the last hour / flag flips in 24 h (targets with applies), and
    # when auto mode last evaluated it or was busy applying (auto targets)
    applies_last_hour: dict[str, int] = field(default_factory=dict)
    flag_flips: dict[str, int] = field(default_factory=dict)
    auto_alive: dict[str, float] = field(default_factory=dict)
    auto_every: dict[str, float] = field(default_factory=dict)  # auto target -> seconds between its evaluations
    memory: dict[str, list[EngineMemory]] = field(default_factory=dict)  # vLLM target -> where its memory goes
    lock: threading.Lock = field(default_factory=threading.Lock)
