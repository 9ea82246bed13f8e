"""The tuning journal: one row per `tuner tune` run, one per trial, each written before what it names happens.

A trial is journaled ``running`` with its server's pid and kernel start time before tuner waits on that server, so
a tuner killed at any moment leaves a record of what it started: the next `tuner tune` stops it (``orphans``), and
``--resume`` continues the run from its finished trials. A run records the tuner running it (pid + kernel start
time): only trials of runs whose tuner is gone are orphans, never those of a tune still at work. Migrations:
migrations/versions/0005_tuning.py, 0008_one_open_apply.py (the owner).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Float, Index, Integer, String, Text, insert, select, update
from sqlalchemy.orm import Mapped, mapped_column

from tuner.names import StrEnum
from tuner.store.db import Tx
from tuner.store.models import Base

__all__ = [
    "TuneRunRow",
    "TuneTrialRow",
    "StoredRun",
    "StoredTrial",
    "begin_run",
    "finish_run",
    "begin_trial",
    "trial_started",
    "finish_trial",
    "get_run",
    "latest_run",
    "runs_since",
    "trials",
    "orphans",
    "set_owner",
    "TRIAL_STATUSES",
    "TrialStatus",
    "RunState",
]


class TrialStatus(StrEnum):
    """A trial's status: ``running`` until it ends measured, crashed, pruned (never started: the memory model or the
    argv ruled it out), interrupted (its tuner stopped) or compared (a `tuner tune --compare` measurement)."""

    RUNNING = "running"
    MEASURED = "measured"
    CRASHED = "crashed"
    PRUNED = "pruned"
    INTERRUPTED = "interrupted"
    COMPARED = "compared"


class RunState(StrEnum):
    """A tuning run's state."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


TRIAL_STATUSES = tuple(TrialStatus)


class TuneRunRow(Base):
    __tablename__ = "tune_runs"
    __table_args__ = (Index("ix_tune_runs_target", "target"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target: Mapped[str] = mapped_column(String(63))
    created_ms: Mapped[int] = mapped_column(Integer)
    updated_ms: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))  # running | done | failed
    request: Mapped[str] = mapped_column(Text)  # JSON: budget, max_time_s, flags searched, where
    workload: Mapped[str] = mapped_column(Text)  # JSON
    slo: Mapped[str] = mapped_column(Text)  # JSON
    baseline_flags: Mapped[str] = mapped_column(Text)  # JSON
    result: Mapped[str] = mapped_column(Text)  # JSON ({} until done)
    note: Mapped[str] = mapped_column(Text)
    owner_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the tuner running it (None: unknown)
    owner_start: Mapped[int | None] = mapped_column(Integer, nullable=True)  # its kernel start time


class TuneTrialRow(Base):
    __tablename__ = "tune_trials"
    __table_args__ = (Index("ix_tune_trials_run", "run_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)  # 1, 2, ... within the run
    flags: Mapped[str] = mapped_column(Text)  # JSON, canonical
    seed: Mapped[str] = mapped_column(Text)  # "baseline", "advisor: <rule>", "compare: ...", "" (the sampler's)
    status: Mapped[str] = mapped_column(String(16))
    capacity_rps: Mapped[float | None] = mapped_column(Float, nullable=True)
    detail: Mapped[str] = mapped_column(Text)  # JSON: the capacity search's steps and runs, or the error
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    proc_start: Mapped[int | None] = mapped_column(Integer, nullable=True)
    url: Mapped[str] = mapped_column(Text)
    started_ms: Mapped[int] = mapped_column(Integer)
    finished_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)


@dataclass(frozen=True)
class StoredTrial:
    id: int
    run_id: int
    seq: int
    flags: dict[str, Any]
    seed: str
    status: str
    capacity_rps: float | None
    detail: dict[str, Any]
    pid: int | None
    proc_start: int | None
    url: str
    started_ms: int
    finished_ms: int | None


@dataclass(frozen=True)
class StoredRun:
    id: int
    target: str
    created_ms: int
    updated_ms: int
    state: str
    request: dict[str, Any]
    workload: dict[str, Any]
    slo: dict[str, Any]
    baseline_flags: dict[str, Any]
    result: dict[str, Any]
    note: str
    owner: tuple[int, int] | None = None  # (pid, kernel start time) of the tuner running it


def _ms(ts: float) -> int:
    return int(round(ts * 1000))


def begin_run(
    engine: Engine,
    *,
    target: str,
    now: float,
    request: dict[str, Any],
    workload: dict[str, Any],
    slo: dict[str, Any],
    baseline_flags: dict[str, Any],
    owner: tuple[int, int] | None = None,
) -> int:
    """A run in state ``running``, owned by ``owner`` (the tuner doing it: pid, kernel start time)."""
    with Tx(engine) as conn:
        return int(
            conn.execute(
                insert(TuneRunRow).values(
                    target=target,
                    created_ms=_ms(now),
                    updated_ms=_ms(now),
                    state=RunState.RUNNING,
                    request=json.dumps(request),
                    workload=json.dumps(workload),
                    slo=json.dumps(slo),
                    baseline_flags=json.dumps(baseline_flags),
                    result="{}",
                    note="",
                    owner_pid=owner[0] if owner else None,
                    owner_start=owner[1] if owner else None,
                )
            ).inserted_primary_key[0]
        )


def set_owner(engine: Engine, run_id: int, owner: tuple[int, int], *, now: float) -> None:
    """``--resume``: the tuner resuming the run owns it (and its trials) from now."""
    with Tx(engine) as conn:
        conn.execute(
            update(TuneRunRow)
            .where(TuneRunRow.id == run_id)
            .values(owner_pid=owner[0], owner_start=owner[1], state=RunState.RUNNING, updated_ms=_ms(now))
        )


def finish_run(
    engine: Engine, run_id: int, *, now: float, state: RunState, result: dict[str, Any], note: str = ""
) -> None:
    with Tx(engine) as conn:
        conn.execute(
            update(TuneRunRow)
            .where(TuneRunRow.id == run_id)
            .values(state=state, updated_ms=_ms(now), result=json.dumps(result), note=note)
        )


def begin_trial(
    engine: Engine,
    run_id: int,
    *,
    now: float,
    flags: dict[str, Any],
    seed: str,
    url: str,
    status: TrialStatus = TrialStatus.RUNNING,
    capacity_rps: float | None = None,
    detail: dict[str, Any] | None = None,
) -> int:
    """Journal a trial before its server starts (``running``), or a pruned one with its reason."""
    with Tx(engine) as conn:
        seq = len(conn.execute(select(TuneTrialRow.id).where(TuneTrialRow.run_id == run_id)).all()) + 1
        return int(
            conn.execute(
                insert(TuneTrialRow).values(
                    run_id=run_id,
                    seq=seq,
                    flags=json.dumps(flags),
                    seed=seed,
                    status=status,
                    capacity_rps=capacity_rps,
                    detail=json.dumps(detail or {}),
                    pid=None,
                    proc_start=None,
                    url=url,
                    started_ms=_ms(now),
                    finished_ms=None if status == TrialStatus.RUNNING else _ms(now),
                )
            ).inserted_primary_key[0]
        )


def trial_started(engine: Engine, trial_id: int, *, pid: int, proc_start: int) -> None:
    with Tx(engine) as conn:
        conn.execute(update(TuneTrialRow).where(TuneTrialRow.id == trial_id).values(pid=pid, proc_start=proc_start))


def finish_trial(
    engine: Engine,
    trial_id: int,
    *,
    now: float,
    status: TrialStatus,
    capacity_rps: float | None,
    detail: dict[str, Any],
) -> None:
    if status not in TRIAL_STATUSES:
        raise ValueError(f"trial status {status!r}: expected one of {', '.join(TRIAL_STATUSES)}")
    with Tx(engine) as conn:
        conn.execute(
            update(TuneTrialRow)
            .where(TuneTrialRow.id == trial_id)
            .values(status=status, capacity_rps=capacity_rps, detail=json.dumps(detail), finished_ms=_ms(now))
        )
        run_id = conn.execute(select(TuneTrialRow.run_id).where(TuneTrialRow.id == trial_id)).scalar_one()
        conn.execute(update(TuneRunRow).where(TuneRunRow.id == run_id).values(updated_ms=_ms(now)))


def _run(r: Any) -> StoredRun:
    return StoredRun(
        id=r.id,
        target=r.target,
        created_ms=r.created_ms,
        updated_ms=r.updated_ms,
        state=r.state,
        request=json.loads(r.request),
        workload=json.loads(r.workload),
        slo=json.loads(r.slo),
        baseline_flags=json.loads(r.baseline_flags),
        result=json.loads(r.result),
        note=r.note,
        owner=(r.owner_pid, r.owner_start or 0) if r.owner_pid is not None else None,
    )


def _trial(r: Any) -> StoredTrial:
    return StoredTrial(
        id=r.id,
        run_id=r.run_id,
        seq=r.seq,
        flags=json.loads(r.flags),
        seed=r.seed,
        status=r.status,
        capacity_rps=r.capacity_rps,
        detail=json.loads(r.detail),
        pid=r.pid,
        proc_start=r.proc_start,
        url=r.url,
        started_ms=r.started_ms,
        finished_ms=r.finished_ms,
    )


def get_run(engine: Engine, run_id: int) -> StoredRun | None:
    with Tx(engine) as conn:
        r = conn.execute(select(TuneRunRow).where(TuneRunRow.id == run_id)).first()
    return _run(r) if r else None


def latest_run(engine: Engine, target: str, *, state: str | None = None) -> StoredRun | None:
    q = select(TuneRunRow).where(TuneRunRow.target == target)
    if state is not None:
        q = q.where(TuneRunRow.state == state)
    with Tx(engine) as conn:
        r = conn.execute(q.order_by(TuneRunRow.id.desc()).limit(1)).first()
    return _run(r) if r else None


def runs_since(engine: Engine, target: str, since_ms: int) -> list[StoredRun]:
    """The target's tuning runs updated since ``since_ms``, newest first."""
    with Tx(engine) as conn:
        rows = conn.execute(
            select(TuneRunRow)
            .where(TuneRunRow.target == target, TuneRunRow.updated_ms >= since_ms)
            .order_by(TuneRunRow.id.desc())
        )
        return [_run(r) for r in rows]


def trials(engine: Engine, run_id: int) -> list[StoredTrial]:
    with Tx(engine) as conn:
        rows = conn.execute(select(TuneTrialRow).where(TuneTrialRow.run_id == run_id).order_by(TuneTrialRow.seq))
        return [_trial(r) for r in rows]


def orphans(engine: Engine, *, alive: Callable[[int, int], bool]) -> list[StoredTrial]:
    """Trials journaled running whose run's tuner is gone (``alive(pid, start)`` says no, or it was never recorded):
    their server may still be up. A trial of a run whose tuner is alive is that tuner's, at work."""
    q = (
        select(TuneTrialRow, TuneRunRow.owner_pid, TuneRunRow.owner_start)
        .join(TuneRunRow, TuneRunRow.id == TuneTrialRow.run_id, isouter=True)
        .where(TuneTrialRow.status == TrialStatus.RUNNING)
    )
    with Tx(engine) as conn:
        rows = conn.execute(q).all()
    return [_trial(r) for r in rows if r.owner_pid is None or not alive(r.owner_pid, r.owner_start or 0)]
