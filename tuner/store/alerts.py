"""Alert state, history and the notification outbox: what lets alerts survive a daemon restart.

State rows mirror Prometheus's in-memory Alert (active/fired/resolved/last-sent times), so pending
timers and resend bookkeeping continue where they stopped. Every notification is written to the
outbox first and deleted from it only once an Alertmanager accepted it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Float, Index, Integer, String, Text, UniqueConstraint, delete, insert, select, update
from sqlalchemy.orm import Mapped, mapped_column

from tuner.errors import StoreError
from tuner.store.models import Base
from tuner.store.rows import driver_connection
from tuner.store.store import Store

__all__ = [
    "AlertStateRow",
    "AlertEventRow",
    "OutboxRow",
    "OutboxItem",
    "load_states",
    "save_states",
    "record_events",
    "history",
    "enqueue",
    "queued",
    "mark_sent",
    "mark_failed",
    "outbox_size",
]


class AlertStateRow(Base):
    __tablename__ = "alert_states"
    __table_args__ = (UniqueConstraint("rule", "fingerprint"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rule: Mapped[str] = mapped_column(String(128))
    fingerprint: Mapped[str] = mapped_column(String(64))
    labels: Mapped[str] = mapped_column(Text)  # JSON object
    annotations: Mapped[str] = mapped_column(Text)  # JSON object
    state: Mapped[str] = mapped_column(String(16))  # pending | firing | inactive (resolved, kept for resends)
    value: Mapped[float] = mapped_column(Float)
    active_at_ms: Mapped[int] = mapped_column(Integer)
    fired_at_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    resolved_at_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_sent_at_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    valid_until_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    keep_firing_since_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)


class AlertEventRow(Base):
    """One state change of one alert: the history `tuner alerts history` shows."""

    __tablename__ = "alert_events"
    __table_args__ = (Index("ix_alert_events_ts", "ts_ms"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts_ms: Mapped[int] = mapped_column(Integer)
    rule: Mapped[str] = mapped_column(String(128))
    fingerprint: Mapped[str] = mapped_column(String(64))
    labels: Mapped[str] = mapped_column(Text)
    from_state: Mapped[str] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    value: Mapped[float] = mapped_column(Float)


class OutboxRow(Base):
    __tablename__ = "alert_outbox"
    __table_args__ = (Index("ix_alert_outbox_due", "alertmanager", "next_attempt_ms"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    alertmanager: Mapped[str] = mapped_column(Text)
    created_ms: Mapped[int] = mapped_column(Integer)
    payload: Mapped[str] = mapped_column(Text)  # JSON list of Alertmanager API v2 alerts
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_ms: Mapped[int] = mapped_column(Integer)
    last_error: Mapped[str] = mapped_column(Text, default="")


@dataclass(frozen=True)
class OutboxItem:
    id: int
    alertmanager: str
    payload: list[dict]
    attempts: int
    next_attempt_ms: int


_FIELDS = (
    "labels",
    "annotations",
    "state",
    "value",
    "active_at_ms",
    "fired_at_ms",
    "resolved_at_ms",
    "last_sent_at_ms",
    "valid_until_ms",
    "keep_firing_since_ms",
)


def _row(a: Mapping[str, Any]) -> dict:
    d = {f: a[f] for f in _FIELDS}
    d["labels"] = json.dumps(a["labels"], sort_keys=True)
    d["annotations"] = json.dumps(a["annotations"], sort_keys=True)
    return d


def load_states(store: Store) -> dict[tuple[str, str], dict[str, Any]]:
    """Every stored alert as a plain row ((rule, fingerprint) -> its fields); the rules own the type."""
    with store.engine.connect() as conn:
        rows = conn.execute(select(AlertStateRow)).all()
    return {
        (r.rule, r.fingerprint): {
            "rule": r.rule,
            "fingerprint": r.fingerprint,
            "labels": json.loads(r.labels),
            "annotations": json.loads(r.annotations),
            "state": r.state,
            "value": r.value,
            "active_at_ms": r.active_at_ms,
            "fired_at_ms": r.fired_at_ms,
            "resolved_at_ms": r.resolved_at_ms,
            "last_sent_at_ms": r.last_sent_at_ms,
            "valid_until_ms": r.valid_until_ms,
            "keep_firing_since_ms": r.keep_firing_since_ms,
        }
        for r in rows
    }


_UPSERT_STATE = f"""
    INSERT INTO alert_states (rule, fingerprint, {", ".join(_FIELDS)}) VALUES ({", ".join("?" * (len(_FIELDS) + 2))})
    ON CONFLICT (rule, fingerprint) DO UPDATE SET {", ".join(f"{f} = excluded.{f}" for f in _FIELDS)}"""
_DELETE_STATE = "DELETE FROM alert_states WHERE rule = ? AND fingerprint = ?"


def _state_params(a: Mapping[str, Any]) -> tuple:
    row = _row(a)
    return (a["rule"], a["fingerprint"], *(row[f] for f in _FIELDS))


def save_states(
    store: Store,
    changed: Iterable[Mapping[str, Any]],
    gone: Iterable[tuple[str, str]] = (),
    *,
    events: Iterable[dict] = (),
    outbox: Iterable[tuple[str, list[dict]]] = (),
    now_ms: int = 0,
) -> None:
    """Write the alerts that changed (a new one, or any field of a stored one), delete the ``gone`` ones (rule,
    fingerprint), append events and enqueue notifications: one transaction. The caller knows what it stored last:
    an evaluation that changed nothing writes nothing (1,000 pending alerts rewritten every 15 s were ~6% of a
    busy daemon's CPU, bench/results/)."""
    with store.lock, store.begin() as conn:
        raw = driver_connection(conn)
        try:
            raw.executemany(_DELETE_STATE, list(gone))
            raw.executemany(_UPSERT_STATE, [_state_params(a) for a in changed])
        except sqlite3.DatabaseError as exc:  # locked, full, read-only: nothing of it is written
            raise StoreError(f"{store.engine.url}: {exc}") from None
        ev = list(events)
        if ev:
            conn.execute(insert(AlertEventRow), ev)
        out = [
            {
                "alertmanager": am,
                "created_ms": now_ms,
                "payload": json.dumps(payload),
                "attempts": 0,
                "next_attempt_ms": now_ms,
                "last_error": "",
            }
            for am, payload in outbox
        ]
        if out:
            conn.execute(insert(OutboxRow), out)


def record_events(store: Store, events: Iterable[dict]) -> None:
    ev = list(events)
    if ev:
        with store.lock, store.begin() as conn:
            conn.execute(insert(AlertEventRow), ev)


def history(store: Store, *, since_ms: int = 0, limit: int = 200) -> list[Any]:
    """Rows with AlertEventRow's columns, newest first."""
    with store.engine.connect() as conn:
        return list(
            conn.execute(
                select(AlertEventRow)
                .where(AlertEventRow.ts_ms >= since_ms)
                .order_by(AlertEventRow.ts_ms.desc(), AlertEventRow.id.desc())
                .limit(limit)
            ).all()
        )


def enqueue(store: Store, alertmanager: str, payload: list[dict], now_ms: int) -> None:
    with store.lock, store.begin() as conn:
        conn.execute(
            insert(OutboxRow).values(
                alertmanager=alertmanager,
                created_ms=now_ms,
                payload=json.dumps(payload),
                attempts=0,
                next_attempt_ms=now_ms,
                last_error="",
            )
        )


def queued(store: Store, limit: int = 200) -> list[OutboxItem]:
    """The outbox, oldest first, including items still waiting out a backoff (they hold back later ones)."""
    with store.engine.connect() as conn:
        rows = conn.execute(select(OutboxRow).order_by(OutboxRow.id).limit(limit)).all()
    return [OutboxItem(r.id, r.alertmanager, json.loads(r.payload), r.attempts, r.next_attempt_ms) for r in rows]


def mark_sent(store: Store, item_id: int) -> None:
    with store.lock, store.begin() as conn:
        conn.execute(delete(OutboxRow).where(OutboxRow.id == item_id))


def mark_failed(store: Store, item_id: int, error: str, next_attempt_ms: int) -> None:
    with store.lock, store.begin() as conn:
        conn.execute(
            update(OutboxRow)
            .where(OutboxRow.id == item_id)
            .values(attempts=OutboxRow.attempts + 1, last_error=error[:500], next_attempt_ms=next_attempt_ms)
        )


def outbox_size(store: Store) -> int:
    with store.engine.connect() as conn:
        return len(conn.execute(select(OutboxRow.id)).all())
