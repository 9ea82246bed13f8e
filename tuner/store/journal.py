"""The apply journal and the managed servers' state: what tuner did to which server, step by step.

An apply row moves through ``STATES`` and ends ``done`` with an ``outcome``; every step is also a row of
``apply_steps`` written *before* the action it names, so a tuner killed at any point leaves a journal that says
where it was (tuner/apply/reconcile.py reads it on restart). An apply whose state is not ``done``
holds the target: no second apply, restart or supervisor action touches that server meanwhile. What it holds is its
``holds`` key, the target's replica group (``group:NAME``) or the target itself (``target:NAME``), and a unique index
over the keys of open applies makes that the database's rule, not a check a second process can slip past (two
processes at the same instant both opened an apply before: migrations/versions/0008_one_open_apply.py). A tuning run
holds its target the same way (kind ``tune``; mode ``shadow`` when its trials run beside production, which then keeps
being supervised).

A tuner that takes over an apply left by a dead one (``claim``) does it by compare-and-set on the owner it read, so
of two reconcilers at once one takes it and the other leaves it alone.

``managed_servers`` holds, per managed target, the process tuner started (pid + its kernel start time, so a
reused pid is never mistaken for it), its argv and the flags in force. Migration:
migrations/versions/0004_apply_journal.py. Timestamps are integer milliseconds since the epoch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, Index, Integer, String, Text, delete, insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from tuner.errors import StoreError, TargetBusyError
from tuner.names import StrEnum
from tuner.store.db import Tx
from tuner.store.models import Base

__all__ = [
    "ApplyState",
    "ApplyStep",
    "ApplyOutcome",
    "ServerState",
    "ApplyRow",
    "ApplyStepRow",
    "ManagedServerRow",
    "StoredApply",
    "ManagedState",
    "STATES",
    "OUTCOMES",
    "new_flags_stand",
    "KPI_KEYS",
    "begin_apply",
    "hold_key",
    "holder",
    "claim",
    "step",
    "finish",
    "set_kpis",
    "get_apply",
    "list_applies",
    "open_applies",
    "open_applies_for",
    "outcome_counts",
    "get_managed",
    "save_managed",
    "forget_managed",
]


class ApplyState(StrEnum):
    """Where an apply (or a tuning run holding its target) is; ``done`` frees the target."""

    PLANNED = "planned"
    DRAINING = "draining"
    STARTING = "starting"
    HEALTH_CHECK = "health_check"
    OBSERVING = "observing"
    AWAITING_MANUAL = "awaiting_manual"
    TUNING = "tuning"
    DONE = "done"


class ApplyStep(StrEnum):
    """The journal's word for each step of an apply, a rollback, a restart or a tuning run (``apply_steps.step``),
    in the order they are usually taken; readers match on them (the outage is draining -> healthy)."""

    PLANNED = "planned"
    BASELINE_WAIT = "baseline_wait"  # the window before held too few scrapes to judge: waiting for more
    BASELINE = "baseline"
    PEER_WAIT = "peer_wait"  # a rolling apply waited for another replica to read UP before draining one
    DRAINING = "draining"
    STOPPED = "stopped"
    STARTING = "starting"
    HEALTH_CHECK = "health_check"
    HEALTHY = "healthy"
    OBSERVING = "observing"
    RESTORING = "restoring"
    RESTORED = "restored"
    RESTORE_FAILED = "restore_failed"
    RESTORE_BY_HAND = "restore_by_hand"
    START_FAILED = "start_failed"
    SLO = "slo"
    VERDICT = "verdict"
    REASON = "reason"
    RECONCILE = "reconcile"
    RECONCILE_FOUND = "reconcile_found"
    SETTLE_FAILED = "settle_failed"
    AWAITING_MANUAL = "awaiting_manual"
    APPLIED_BY_HAND = "applied_by_hand"
    HOOK = "hook"
    DROPIN = "dropin"
    PATCH = "patch"
    IN_ROTATION = "in_rotation"
    REMOVED = "removed"
    ROLLOUT = "rollout"
    ROOM = "room"
    CANARY = "canary"
    TUNING = "tuning"


class ApplyOutcome(StrEnum):
    """How a finished apply ended (the ``outcome`` column, tuner_applies_total's ``outcome`` label)."""

    KEPT = "kept"
    ROLLED_BACK = "rolled_back"
    INCONCLUSIVE = "inconclusive"
    FAILED = "failed"
    UNCHANGED = "unchanged"  # a tuning run's hold: the flags in force stand as before (never touched, or restored)


class ServerState(StrEnum):
    """A managed server's state (``managed_servers.state``)."""

    RUNNING = "running"
    STOPPED = "stopped"
    CRASHED = "crashed"
    GIVEN_UP = "given_up"


STATES = tuple(ApplyState)
OUTCOMES = tuple(ApplyOutcome)
KPI_KEYS = (
    "saturated",
    "offered_rps",
    "capacity_rps",
    "slo_goodput_rps",
    "slo_token_goodput_tps",
    "slo_attainment",
    "ttft_p99",
    "e2e_p99",
    "capacity_tokens_per_s",
)


# The one rule every apply, rollback, canary and tune obeys: one open entry per key (a target, or its whole group).
_OPEN = text("state != 'done'")


class ApplyRow(Base):
    __tablename__ = "applies"
    __table_args__ = (
        Index("ix_applies_target_state", "target", "state"),
        Index("ux_applies_open_holds", "holds", unique=True, sqlite_where=_OPEN, postgresql_where=_OPEN),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target: Mapped[str] = mapped_column(String(63))
    holds: Mapped[str] = mapped_column(String(72), server_default="")  # hold_key(): group:NAME or target:NAME
    recommendation_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    kind: Mapped[str] = mapped_column(String(16))  # apply | rollback | canary | tune | restart
    mode: Mapped[str] = mapped_column(String(16))  # manual | auto | api | reconcile | shadow (a tune beside production)
    created_ms: Mapped[int] = mapped_column(Integer)
    updated_ms: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    outcome: Mapped[str | None] = mapped_column(String(16), nullable=True)
    diff: Mapped[str] = mapped_column(Text)  # JSON flag -> new value
    old_flags: Mapped[str] = mapped_column(Text)  # JSON: every tunable flag in force before
    new_flags: Mapped[str] = mapped_column(Text)  # JSON: every tunable flag after
    old_argv: Mapped[str] = mapped_column(Text)  # JSON list ([] for unmanaged targets)
    new_argv: Mapped[str] = mapped_column(Text)
    baseline: Mapped[str] = mapped_column(Text)  # JSON KPI -> number | null, the window before
    after: Mapped[str] = mapped_column(Text)  # JSON KPI -> number | null, the observed window after
    note: Mapped[str] = mapped_column(Text)
    owner_pid: Mapped[int] = mapped_column(Integer)  # the tuner process doing it
    owner_start: Mapped[int] = mapped_column(Integer)  # its kernel start time (clock ticks since boot)


class ApplyStepRow(Base):
    __tablename__ = "apply_steps"
    __table_args__ = (Index("ix_apply_steps_apply", "apply_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    apply_id: Mapped[int] = mapped_column(Integer)
    ts_ms: Mapped[int] = mapped_column(Integer)
    step: Mapped[str] = mapped_column(String(32))
    detail: Mapped[str] = mapped_column(Text)


class ManagedServerRow(Base):
    __tablename__ = "managed_servers"
    target: Mapped[str] = mapped_column(String(63), primary_key=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    proc_start: Mapped[int | None] = mapped_column(Integer, nullable=True)
    argv: Mapped[str] = mapped_column(Text)  # JSON list
    flags: Mapped[str] = mapped_column(Text)  # JSON: tunable flags in force
    config_flags: Mapped[str] = mapped_column(Text)  # JSON: the config file's flags these were derived from
    started_ms: Mapped[int] = mapped_column(Integer)
    restarts: Mapped[str] = mapped_column(Text)  # JSON list of ms timestamps of automatic restarts
    state: Mapped[str] = mapped_column(String(16))  # a ServerState: running | stopped | crashed | given_up
    updated_ms: Mapped[int] = mapped_column(Integer)
    note: Mapped[str] = mapped_column(Text)


@dataclass(frozen=True)
class StoredApply:
    id: int
    target: str
    recommendation_id: int | None
    kind: str
    mode: str
    created_ms: int
    updated_ms: int
    state: str
    outcome: str | None
    diff: dict[str, Any]
    old_flags: dict[str, Any]
    new_flags: dict[str, Any]
    old_argv: list[str]
    new_argv: list[str]
    baseline: dict[str, Any]
    after: dict[str, Any]
    note: str
    owner_pid: int
    owner_start: int
    holds: str = ""  # hold_key(): what it holds while open
    steps: list[dict[str, Any]] = field(default_factory=list)  # {ts_ms, step, detail}, oldest first

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ManagedState:
    target: str
    pid: int | None
    proc_start: int | None
    argv: list[str]
    flags: dict[str, Any]
    config_flags: dict[str, Any]
    started_ms: int
    restarts: list[int]
    state: str
    updated_ms: int
    note: str


def _ms(ts: float) -> int:
    return int(round(ts * 1000))


def _stored(r: Any, steps: list[dict[str, Any]]) -> StoredApply:
    return StoredApply(
        id=r.id,
        target=r.target,
        recommendation_id=r.recommendation_id,
        kind=r.kind,
        mode=r.mode,
        created_ms=r.created_ms,
        updated_ms=r.updated_ms,
        state=r.state,
        outcome=r.outcome,
        diff=json.loads(r.diff),
        old_flags=json.loads(r.old_flags),
        new_flags=json.loads(r.new_flags),
        old_argv=json.loads(r.old_argv),
        new_argv=json.loads(r.new_argv),
        baseline=json.loads(r.baseline),
        after=json.loads(r.after),
        note=r.note,
        owner_pid=r.owner_pid,
        owner_start=r.owner_start,
        holds=r.holds,
        steps=steps,
    )


def hold_key(target: str, group: str | None = None) -> str:
    """What an apply of ``target`` holds: its replica group when it is in one (one change at a time per group: a
    rolling apply changes every replica), else the target. Target names have no ``:``: the two never meet."""
    return f"group:{group}" if group else f"target:{target}"


def holder(engine: Engine, key: str) -> StoredApply | None:
    """The open apply (or tune) holding ``key``, if any."""
    with engine.connect() as conn:
        r = conn.execute(select(ApplyRow).where(ApplyRow.holds == key, ApplyRow.state != ApplyState.DONE)).first()
    return None if r is None else _stored(r, [])


def _busy(engine: Engine, target: str, key: str) -> TargetBusyError | None:
    """The refusal naming what holds ``key``; None when it was closed in between (the caller tries again)."""
    held = holder(engine, key)
    if held is None:
        return None
    return TargetBusyError(
        target,
        held.id,
        held_target=held.target,
        kind=held.kind,
        mode=held.mode,
        group=key[len("group:") :] if key.startswith("group:") else None,
    )


def begin_apply(
    engine: Engine,
    *,
    target: str,
    recommendation_id: int | None,
    kind: str,
    mode: str,
    now: float,
    diff: dict[str, Any],
    old_flags: dict[str, Any],
    new_flags: dict[str, Any],
    old_argv: list[str],
    new_argv: list[str],
    owner_pid: int,
    owner_start: int,
    group: str | None = None,
) -> int:
    """Open an apply in state ``planned``; TargetBusyError (naming the apply that holds it) when the target, or the
    replica group ``group`` it belongs to, already has an open one. The unique index decides: of two processes
    opening at the same instant, the second's insert fails, whatever either read before."""
    key = hold_key(target, group)
    for _ in range(3):  # again only when the holder closed between the refused insert and the look at it
        try:
            with Tx(engine) as conn:
                apply_id = int(
                    conn.execute(
                        insert(ApplyRow).values(
                            target=target,
                            holds=key,
                            recommendation_id=recommendation_id,
                            kind=kind,
                            mode=mode,
                            created_ms=_ms(now),
                            updated_ms=_ms(now),
                            state=ApplyState.PLANNED,
                            outcome=None,
                            diff=json.dumps(diff),
                            old_flags=json.dumps(old_flags),
                            new_flags=json.dumps(new_flags),
                            old_argv=json.dumps(old_argv),
                            new_argv=json.dumps(new_argv),
                            baseline="{}",
                            after="{}",
                            note="",
                            owner_pid=owner_pid,
                            owner_start=owner_start,
                        )
                    ).inserted_primary_key[0]
                )
                conn.execute(
                    insert(ApplyStepRow).values(
                        apply_id=apply_id, ts_ms=_ms(now), step=ApplyStep.PLANNED, detail=json.dumps(diff)
                    )
                )
            return apply_id
        except IntegrityError:
            busy = _busy(engine, target, key)
            if busy is not None:
                raise busy from None
    raise StoreError(f"{engine.url}: could not open an apply of {target}: its hold ({key}) kept changing hands")


def claim(
    engine: Engine,
    a: StoredApply,
    owner: tuple[int, int],
    step_name: str,
    detail: str,
    *,
    now: float,
    state: ApplyState | None = None,
) -> bool:
    """Take over open apply ``a`` as ``owner`` (and move it to ``state``) if it is still as it was read: same state,
    same owner (compare-and-set); journals step ``step_name`` when it did. False: another tuner took it first, or it
    moved on meanwhile."""
    values: dict[str, Any] = {"owner_pid": owner[0], "owner_start": owner[1], "updated_ms": _ms(now)}
    if state is not None:
        values["state"] = state
    with Tx(engine) as conn:
        done = conn.execute(
            update(ApplyRow)
            .where(
                ApplyRow.id == a.id,
                ApplyRow.state == a.state,
                ApplyRow.owner_pid == a.owner_pid,
                ApplyRow.owner_start == a.owner_start,
            )
            .values(**values)
        ).rowcount
        if done == 1:
            conn.execute(insert(ApplyStepRow).values(apply_id=a.id, ts_ms=_ms(now), step=step_name, detail=detail))
    return done == 1


def step(
    engine: Engine,
    apply_id: int,
    name: str,
    detail: str = "",
    *,
    now: float,
    state: ApplyState | None = None,
    owner: tuple[int, int] | None = None,
) -> None:
    """Journal one step (and move the apply to ``state`` when given). Written before the action it names."""
    values: dict[str, Any] = {"updated_ms": _ms(now)}
    if state is not None:
        if state not in STATES:
            raise ValueError(f"state {state!r}: expected one of {', '.join(STATES)}")
        values["state"] = state
    if owner is not None:
        values["owner_pid"], values["owner_start"] = owner
    with Tx(engine) as conn:
        conn.execute(update(ApplyRow).where(ApplyRow.id == apply_id).values(**values))
        conn.execute(insert(ApplyStepRow).values(apply_id=apply_id, ts_ms=_ms(now), step=name, detail=detail))


def set_kpis(
    engine: Engine,
    apply_id: int,
    *,
    now: float,
    baseline: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> None:
    values: dict[str, Any] = {"updated_ms": _ms(now)}
    if baseline is not None:
        values["baseline"] = json.dumps(baseline)
    if after is not None:
        values["after"] = json.dumps(after)
    with Tx(engine) as conn:
        conn.execute(update(ApplyRow).where(ApplyRow.id == apply_id).values(**values))


def finish(engine: Engine, apply_id: int, outcome: ApplyOutcome, note: str, *, now: float) -> None:
    """Close the apply with its outcome (kept | rolled_back | inconclusive | failed | unchanged); the target is free
    again."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r}: expected one of {', '.join(OUTCOMES)}")
    with Tx(engine) as conn:
        conn.execute(
            update(ApplyRow)
            .where(ApplyRow.id == apply_id)
            .values(state=ApplyState.DONE, outcome=outcome, note=note, updated_ms=_ms(now))
        )
        conn.execute(
            insert(ApplyStepRow).values(apply_id=apply_id, ts_ms=_ms(now), step=f"done: {outcome}", detail=note)
        )


def _steps(conn: Any, ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {i: [] for i in ids}
    if not ids:
        return out
    q = select(ApplyStepRow).where(ApplyStepRow.apply_id.in_(ids)).order_by(ApplyStepRow.id)
    for s in conn.execute(q):
        out[s.apply_id].append({"ts_ms": s.ts_ms, "step": s.step, "detail": s.detail})
    return out


def new_flags_stand(a: StoredApply) -> bool:
    """Whether a finished apply (or a canary rolled out) left its new flags in force: kept, or inconclusive and kept under
    ``apply.on_inconclusive: keep`` (then no step restored the old ones)."""
    if a.state != ApplyState.DONE or a.kind not in ("apply", "canary"):
        return False
    restored = any(st["step"] in ("restoring", "restored", "restore_by_hand") for st in a.steps)
    return a.outcome == ApplyOutcome.KEPT or (a.outcome == ApplyOutcome.INCONCLUSIVE and not restored)


def list_applies(
    engine: Engine, *, target: str | None = None, since_ms: int | None = None, limit: int | None = None
) -> list[StoredApply]:
    """Newest first, each with its steps."""
    q = select(ApplyRow).order_by(ApplyRow.id.desc())
    if target is not None:
        q = q.where(ApplyRow.target == target)
    if since_ms is not None:
        q = q.where(ApplyRow.updated_ms >= since_ms)
    if limit is not None:
        q = q.limit(limit)
    with engine.connect() as conn:
        rows = list(conn.execute(q))
        steps = _steps(conn, [r.id for r in rows])
    return [_stored(r, steps[r.id]) for r in rows]


def targets_with_applies(engine: Engine) -> set[str]:
    """Names of the targets the journal has any apply of (one query: the rest run with their config's flags)."""
    with engine.connect() as conn:
        return set(conn.execute(select(ApplyRow.target).distinct()).scalars())


def open_applies(engine: Engine) -> list[StoredApply]:
    """Applies not done (in progress, or left behind by a tuner that died), oldest first."""
    with engine.connect() as conn:
        rows = list(conn.execute(select(ApplyRow).where(ApplyRow.state != ApplyState.DONE).order_by(ApplyRow.id)))
        steps = _steps(conn, [r.id for r in rows])
    return [_stored(r, steps[r.id]) for r in rows]


def open_applies_for(engine: Engine, target: str, *, shadow: bool = True) -> list[int]:
    """Ids of the target's applies not done (cheap: the supervisor asks every few seconds); ``shadow=False`` leaves
    out tuning runs whose trials run beside production (they hold the target against applies, not its server)."""
    q = select(ApplyRow.id).where(ApplyRow.target == target, ApplyRow.state != ApplyState.DONE)
    if not shadow:
        q = q.where(ApplyRow.mode != "shadow")
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(q)]


def get_apply(engine: Engine, apply_id: int) -> StoredApply:
    with engine.connect() as conn:
        r = conn.execute(select(ApplyRow).where(ApplyRow.id == apply_id)).first()
        if r is None:
            raise StoreError(f"no apply #{apply_id} in the journal (see `tuner journal`)")
        return _stored(r, _steps(conn, [r.id])[r.id])


def outcome_counts(engine: Engine) -> dict[tuple[str, str], int]:
    """(target, outcome) -> finished applies, for tuner's own /metrics (a tuning run beside production changed
    nothing: not counted)."""
    from sqlalchemy import func

    q = (
        select(ApplyRow.target, ApplyRow.outcome, func.count())
        .where(ApplyRow.state == ApplyState.DONE, ApplyRow.mode != "shadow")
        .group_by(ApplyRow.target, ApplyRow.outcome)
    )
    with engine.connect() as conn:
        return {(t, o or ""): int(n) for t, o, n in conn.execute(q)}  # done: never without an outcome


def get_managed(engine: Engine, target: str) -> ManagedState | None:
    with engine.connect() as conn:
        r = conn.execute(select(ManagedServerRow).where(ManagedServerRow.target == target)).first()
    if r is None:
        return None
    return ManagedState(
        target=r.target,
        pid=r.pid,
        proc_start=r.proc_start,
        argv=json.loads(r.argv),
        flags=json.loads(r.flags),
        config_flags=json.loads(r.config_flags),
        started_ms=r.started_ms,
        restarts=json.loads(r.restarts),
        state=r.state,
        updated_ms=r.updated_ms,
        note=r.note,
    )


def save_managed(engine: Engine, s: ManagedState) -> None:
    values = {
        "pid": s.pid,
        "proc_start": s.proc_start,
        "argv": json.dumps(s.argv),
        "flags": json.dumps(s.flags),
        "config_flags": json.dumps(s.config_flags),
        "started_ms": s.started_ms,
        "restarts": json.dumps(s.restarts),
        "state": s.state,
        "updated_ms": s.updated_ms,
        "note": s.note,
    }
    with Tx(engine) as conn:
        done = conn.execute(
            update(ManagedServerRow).where(ManagedServerRow.target == s.target).values(**values)
        ).rowcount
        if not done:
            conn.execute(insert(ManagedServerRow).values(target=s.target, **values))


def forget_managed(engine: Engine, target: str) -> None:
    with Tx(engine) as conn:
        conn.execute(delete(ManagedServerRow).where(ManagedServerRow.target == target))
