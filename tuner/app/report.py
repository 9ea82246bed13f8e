"""The HTML report: what the store holds over a period, per target, with alerts and applies marked."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tuner.app.session import Session
from tuner.errors import ConfigError, UnknownTargetError
from tuner.report.data import collect
from tuner.report.html import render_html

__all__ = ["ReportWritten", "write_report"]


@dataclass(frozen=True)
class ReportWritten:
    path: Path
    targets: int
    plots: int
    alert_events: int
    applies: int
    size_bytes: int


_MIN_SPAN_S = 60.0


def _fit(span: tuple[float, float] | None, start: float, end: float) -> tuple[float, float]:
    """The period asked, cut to the stored data in it, so a 4-minute run fills the plots' width (issue: a
    24-hour default left the demo's data a sliver at the right edge). At least a minute; nothing stored: as asked."""
    if span is None:
        return start, end
    lo, hi = span
    if hi - lo < _MIN_SPAN_S:
        lo = max(start, hi - _MIN_SPAN_S)
    return lo, hi


def write_report(
    session: Session, out: Path, *, target: str | None, start: float, end: float, points: int, window_s: float | None
) -> ReportWritten:
    store = session.store
    known = store.target_names()
    if target and target not in known:
        raise UnknownTargetError(target, known)
    if out.is_dir() or not out.parent.is_dir():
        raise ConfigError(str(out), "-o", "give a file path in an existing directory, e.g. report.html")
    slos = {t.name: t.slo for t in session.cfg.targets}
    baselines = {t.name: t.apply.baseline.total_seconds() for t in session.cfg.targets}
    reports = []
    for name in [target] if target else known:
        lo, hi = _fit(store.data_span(name, start, end), start, end)
        reports.append(
            collect(
                store,
                name,
                start=lo,
                end=hi,
                points=points,
                window_s=window_s,
                slo=slos.get(name),
                baseline_s=baselines.get(name, 300.0),
            )
        )
    html = render_html(reports, title=f"tuner report — {target or 'all targets'}", generated_at=time.time())
    out.write_text(html, encoding="utf-8")
    return ReportWritten(
        out,
        len(reports),
        html.count('<div class="plot" '),
        sum(len(r.alerts) for r in reports),
        sum(len(r.applies) for r in reports),
        len(html.encode()),
    )
