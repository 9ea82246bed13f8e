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


def write_report(session: Session, out: Path, *, target: str | None, start: float, end: float, points: int,
                 window_s: float | None) -> ReportWritten:
    store = session.store
    known = store.target_names()
    if target and target not in known:
        raise UnknownTargetError(target, known)
    if out.is_dir() or not out.parent.is_dir():
        raise ConfigError(str(out), "-o", "give a file path in an existing directory, e.g. report.html")
    slos = {t.name: t.slo for t in session.cfg.targets}
    reports = [collect(store, name, start=start, end=end, points=points, window_s=window_s, slo=slos.get(name))
               for name in ([target] if target else known)]
    html = render_html(reports, title=f"tuner report — {target or 'all targets'}", generated_at=time.time())
    out.write_text(html, encoding="utf-8")
    return ReportWritten(out, len(reports), html.count('<svg class="plot"'), sum(len(r.alerts) for r in reports),
                         sum(len(r.applies) for r in reports), len(html.encode()))
