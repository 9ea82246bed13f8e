"""Recommendations in the store: one row each, with its diff, evidence and memory check as JSON.

Status moves proposed -> applied | rejected | expired, applied -> rolled_back | failed. Timestamps are integer
milliseconds since the epoch, as everywhere in the store. Migration: migrations/versions/0003_recommendations.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Float, Index, Integer, String, Text, insert, select, update
from sqlalchemy.orm import Mapped, mapped_column

from tuner.errors import RecommendationNotFoundError
from tuner.names import StrEnum
from tuner.store.db import Tx
from tuner.store.models import Base

__all__ = [
    "RecStatus",
    "RecommendationRow",
    "StoredRecommendation",
    "STATUSES",
    "add_recommendation",
    "renew_recommendation",
    "set_status",
    "list_recommendations",
    "get_recommendation",
    "proposed_for",
]


class RecStatus(StrEnum):
    """Where a recommendation stands."""

    PROPOSED = "proposed"
    APPLIED = "applied"
    REJECTED = "rejected"
    EXPIRED = "expired"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"


STATUSES = tuple(RecStatus)


class RecommendationRow(Base):
    __tablename__ = "recommendations"
    __table_args__ = (Index("ix_recommendations_target_status", "target", "status"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target: Mapped[str] = mapped_column(String(63))  # target name (history outlives the config entry)
    created_ms: Mapped[int] = mapped_column(Integer)
    updated_ms: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    rules: Mapped[str] = mapped_column(Text)  # JSON list of rule names
    diff_key: Mapped[str] = mapped_column(Text)  # canonical JSON of the diff: duplicates share it
    diff: Mapped[str] = mapped_column(Text)  # JSON object flag -> proposed value
    current: Mapped[str] = mapped_column(Text)  # JSON object flag -> value when proposed
    evidence: Mapped[str] = mapped_column(Text)  # JSON list, one object per rule
    expected_effect: Mapped[str] = mapped_column(Text)
    risk: Mapped[str] = mapped_column(Text)
    confidence: Mapped[float] = mapped_column(Float)  # 0-1
    rank: Mapped[int] = mapped_column(Integer)  # order among alternatives (1 first)
    memory_check: Mapped[str] = mapped_column(Text)  # JSON object {ok, reason, before, after}
    note: Mapped[str] = mapped_column(Text, default="")  # why the status last changed


@dataclass(frozen=True)
class StoredRecommendation:
    id: int
    target: str
    created_ms: int
    updated_ms: int
    status: str
    rules: list[str]
    diff_key: str
    diff: dict[str, Any]
    current: dict[str, Any]
    evidence: list[dict[str, Any]]
    expected_effect: str
    risk: str
    confidence: float
    rank: int
    memory_check: dict[str, Any]
    note: str

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _stored(r: Any) -> StoredRecommendation:
    return StoredRecommendation(
        id=r.id,
        target=r.target,
        created_ms=r.created_ms,
        updated_ms=r.updated_ms,
        status=r.status,
        rules=json.loads(r.rules),
        diff_key=r.diff_key,
        diff=json.loads(r.diff),
        current=json.loads(r.current),
        evidence=json.loads(r.evidence),
        expected_effect=r.expected_effect,
        risk=r.risk,
        confidence=r.confidence,
        rank=r.rank,
        memory_check=json.loads(r.memory_check),
        note=r.note,
    )


def _ms(ts: float) -> int:
    return int(round(ts * 1000))


def add_recommendation(
    engine: Engine,
    *,
    target: str,
    now: float,
    rules: Iterable[str],
    diff_key: str,
    diff: dict[str, Any],
    current: dict[str, Any],
    evidence: list[dict[str, Any]],
    expected_effect: str,
    risk: str,
    confidence: float,
    rank: int,
    memory_check: dict[str, Any],
) -> int:
    """Store a new proposal; returns its id."""
    with Tx(engine) as conn:
        return int(
            conn.execute(
                insert(RecommendationRow).values(
                    target=target,
                    created_ms=_ms(now),
                    updated_ms=_ms(now),
                    status="proposed",
                    rules=json.dumps(list(rules)),
                    diff_key=diff_key,
                    diff=json.dumps(diff),
                    current=json.dumps(current),
                    evidence=json.dumps(evidence, default=str),
                    expected_effect=expected_effect,
                    risk=risk,
                    confidence=confidence,
                    rank=rank,
                    memory_check=json.dumps(memory_check, default=str),
                    note="",
                )
            ).inserted_primary_key[0]
        )


def renew_recommendation(
    engine: Engine,
    rec_id: int,
    *,
    now: float,
    rules: Iterable[str],
    evidence: list[dict[str, Any]],
    confidence: float,
    memory_check: dict[str, Any],
    current: dict[str, Any] | None = None,
) -> None:
    """A proposal seen again: fresh evidence and memory check (and ``current``, the flags it was seen against
    this time, when given), same id."""
    values: dict[str, Any] = {
        "updated_ms": _ms(now),
        "rules": json.dumps(list(rules)),
        "evidence": json.dumps(evidence, default=str),
        "confidence": confidence,
        "memory_check": json.dumps(memory_check, default=str),
    }
    if current is not None:
        values["current"] = json.dumps(current)
    with Tx(engine) as conn:
        conn.execute(update(RecommendationRow).where(RecommendationRow.id == rec_id).values(**values))


def set_status(engine: Engine, rec_id: int, status: str, *, now: float, note: str = "") -> None:
    if status not in STATUSES:
        raise ValueError(f"status {status!r}: expected one of {', '.join(STATUSES)}")
    with Tx(engine) as conn:
        done = conn.execute(
            update(RecommendationRow)
            .where(RecommendationRow.id == rec_id)
            .values(status=status, updated_ms=_ms(now), note=note)
        ).rowcount
    if not done:
        raise RecommendationNotFoundError(rec_id)


def list_recommendations(
    engine: Engine, *, target: str | None = None, status: str | None = None
) -> list[StoredRecommendation]:
    """Newest first."""
    q = select(RecommendationRow).order_by(RecommendationRow.id.desc())
    if target is not None:
        q = q.where(RecommendationRow.target == target)
    if status is not None:
        q = q.where(RecommendationRow.status == status)
    with engine.connect() as conn:
        return [_stored(r) for r in conn.execute(q)]


def proposed_for(engine: Engine, target: str) -> list[StoredRecommendation]:
    return list_recommendations(engine, target=target, status="proposed")


def get_recommendation(engine: Engine, rec_id: int) -> StoredRecommendation:
    with engine.connect() as conn:
        r = conn.execute(select(RecommendationRow).where(RecommendationRow.id == rec_id)).first()
    if r is None:
        raise RecommendationNotFoundError(rec_id)
    return _stored(r)
