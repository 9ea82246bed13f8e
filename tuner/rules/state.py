"""Alert state, owned by the rules: Prometheus's Alert (tuner/rules/evaluate.py moves it through
inactive -> pending -> firing -> resolved). The store persists it as plain rows (tuner/store/alerts.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Alert", "from_row", "to_row"]


@dataclass
class Alert:
    """Prometheus's Alert. Times are unix ms; None where Prometheus has a zero time."""

    rule: str
    fingerprint: str
    labels: dict[str, str]
    annotations: dict[str, str]
    state: str
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
