"""Alert state, owned by the rules: Prometheus's Alert (tuner/rules/evaluate.py moves it through
inactive -> pending -> firing -> resolved). The store persists it as plain rows (tuner/store/alerts.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.names import StrEnum

__all__ = ["Alert", "AlertState", "from_row", "to_row"]


class AlertState(StrEnum):
    """Prometheus's alert states (a resolved alert is ``inactive`` with ``resolved_at_ms`` set)."""

    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"


@dataclass
class Alert:
    """Prometheus's Alert. Times are unix ms; None where Prometheus has a zero time."""

    rule: str
    fingerprint: str
    labels: dict[str, str]
    annotations: dict[str, str]
    state: str  # an AlertState
    value: float
    active_at_ms: int
    fired_at_ms: int | None = None
    resolved_at_ms: int | None = None
    last_sent_at_ms: int | None = None
    valid_until_ms: int | None = None
    keep_firing_since_ms: int | None = None


def from_row(row: Mapping[str, Any]) -> Alert:
    return Alert(**row)


def to_row(a: Alert) -> dict[str, Any]:
    return dict(vars(a))  # its fields (labels and annotations are replaced, never changed in place)
