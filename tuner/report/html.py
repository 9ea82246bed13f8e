"""One self-contained HTML file: inline CSS, one embedded copy of plotly.js, and each chart as a plotly figure.

Each chart is a ``<div class="plot [apply-view|scatter]" data-plot="title">`` holding its figure as JSON in
``<script type="application/json" class="figure">`` (plotly's own serialisation) and an empty ``<div
class="chart">`` that the page's last script draws it into with ``Plotly.newPlot``. Nothing is fetched: plotly.js
is inlined, the figures carry their data. Tables list the alerts, per apply the verdict's KPIs before and after,
and per tuning run its trials.
"""

from __future__ import annotations

import math
import time
from functools import lru_cache
from html import escape
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from tuner.report.data import PLOTS, Plot, TargetReport
from tuner.report.figures import MARKER_COLORS, pareto, time_series, trials_scatter
from tuner.rules.state import AlertState
from tuner.store.journal import ApplyOutcome
from tuner.store.tuning import TrialStatus

__all__ = ["render_html", "figure_html", "pareto", "plotly_js"]

# The verdict's KPIs (tuner/apply/verdict.py), each with the direction that is better.
KPI_LABELS = {
    "offered_rps": ("Offered load, req/s (the load, not a KPI)", "per_s"),
    "capacity_rps": ("Capacity, req/s (higher is better)", "per_s"),
    "slo_goodput_rps": ("SLO goodput, req/s (higher is better)", "per_s"),
    "slo_attainment": ("SLO attainment (higher is better)", "ratio"),
    "ttft_p99": ("TTFT P99 (lower is better)", "s"),
    "e2e_p99": ("E2E P99 (lower is better)", "s"),
    "capacity_tokens_per_s": ("Capacity, tokens/s (higher is better)", "per_s"),
}


def _fmt(v: float | None, unit: str, scale: float = 1.0) -> str:
    """``scale``: the axis maximum, so that small axes get enough digits to tell their ticks apart."""
    if v is None or not math.isfinite(v):
        return "-"
    if unit == "ratio":
        return f"{v * 100:.{max(1, 2 - math.floor(math.log10(scale * 100 or 1)))}f}%"
    if unit == "s":
        return f"{v * 1000:.0f} ms" if abs(v) < 1 else f"{v:.2f} s"
    if unit == "per_s":
        return f"{v:,.1f}/s"
    return f"{v:g}" if float(v).is_integer() else f"{v:.2f}"


def _time(ts_ms: int, span_s: float) -> str:
    fmt = "%H:%M:%S" if span_s < 3 * 3600 else ("%H:%M" if span_s < 2 * 86400 else "%m-%d %H:%M")
    return time.strftime(fmt, time.gmtime(ts_ms / 1000))


def _markers(rep: TargetReport) -> list[tuple[int, str, str]]:
    marks = [
        (a.ts_ms, "alert", f"{a.alertname} {a.from_state} -> {a.to_state}")
        for a in rep.alerts
        if a.to_state == AlertState.FIRING
    ]
    for ap in rep.applies:
        marks.append((ap.created_ms, "apply", f"apply #{ap.id} {_diff(ap.diff)}"))
        if ap.outcome in (ApplyOutcome.ROLLED_BACK, ApplyOutcome.INCONCLUSIVE, ApplyOutcome.FAILED):
            marks.append((ap.updated_ms, "rollback", f"apply #{ap.id} {ap.outcome}: {ap.note}"))
    return marks


def _diff(diff: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(diff.items()))


def _change(before: Any, after: Any) -> str:
    if not isinstance(before, (int, float)) or not isinstance(after, (int, float)) or not before:
        return "-"
    return f"{(after - before) / abs(before) * 100:+.1f}%"


def _applies_html(rep: TargetReport) -> str:
    if not rep.applies:
        return '<p class="none">No applies in this period.</p>'
    parts = []
    for ap in rep.applies:
        head = (
            f"<h4>Apply #{ap.id} ({escape(getattr(ap, 'kind', 'apply'))}): {escape(_diff(ap.diff))} — "
            f'<span class="outcome {escape(ap.outcome or "running")}">{escape(ap.outcome or ap.state)}</span></h4>'
            f"<p>started {_time(ap.created_ms, 86400 * 3)} UTC, last step {_time(ap.updated_ms, 86400 * 3)} UTC"
            + (f", recommendation #{ap.recommendation_id}" if ap.recommendation_id is not None else "")
            + (f". {escape(ap.note)}" if ap.note else "")
            + "</p>"
        )
        rows = "".join(
            f'<tr class="kpi" data-apply="{ap.id}" data-kpi="{k}"><td>{label}</td>'
            f"<td>{_fmt(ap.baseline.get(k), unit)}</td><td>{_fmt(ap.after.get(k), unit)}</td>"
            f"<td>{_change(ap.baseline.get(k), ap.after.get(k))}</td></tr>"
            for k, (label, unit) in KPI_LABELS.items()
        )
        parts.append(
            f'<div class="apply" data-apply="{ap.id}">{head}<table class="beforeafter">'
            f"<tr><th>KPI</th><th>before</th><th>after</th><th>change</th></tr>{rows}</table>"
            f"{_apply_view_html(rep, ap)}</div>"
        )
    return "".join(parts)


def _apply_view_html(rep: TargetReport, ap: Any) -> str:
    """The apply's own before/after plots: its start and end marked, the span from a baseline before to 30 s after."""
    view = rep.apply_views.get(ap.id)
    if view is None:
        return ""
    marks = [(ap.created_ms, "apply", f"apply #{ap.id} started")]
    if ap.outcome:
        marks.append(
            (ap.updated_ms, "rollback" if ap.outcome != ApplyOutcome.KEPT else "apply", f"apply #{ap.id} {ap.outcome}")
        )
    out = []
    for (engine, _model), plots in sorted(view.series.items()):
        for plot in PLOTS:
            if plot.key in plots:
                title = f"apply #{ap.id}: {plot.title} (engine {engine})"
                out.append(
                    figure_html(
                        time_series(title, plot.unit, plots[plot.key], view.start_ms, view.end_ms, marks),
                        title,
                        "plot apply-view",
                    )
                )
    return "".join(out)


def _alerts_html(rep: TargetReport) -> str:
    if not rep.alerts:
        return '<p class="none">No alert state changes in this period.</p>'
    rows = "".join(
        f'<tr class="alert-event"><td>{_time(a.ts_ms, 86400 * 3)}</td><td>{escape(a.alertname)}</td>'
        f"<td>{escape(a.from_state)} → {escape(a.to_state)}</td><td>{a.value:g}</td>"
        f"<td>{escape(a.labels.get('severity', ''))}</td></tr>"
        for a in rep.alerts
    )
    return (
        '<table class="alerts"><tr><th>time (UTC)</th><th>alert</th><th>change</th><th>value</th>'
        f"<th>severity</th></tr>{rows}</table>"
    )


def _tuning_html(rep: TargetReport) -> str:
    if not rep.tunes:
        return '<p class="none">No tuning runs in this period.</p>'
    parts = []
    for run, trs in rep.tunes:
        res = run.result or {}
        measured = [t for t in trs if t.status == TrialStatus.MEASURED and t.capacity_rps is not None]
        lat = [float(t.detail.get("e2e_p99") or 0.0) for t in measured]
        front = pareto([(t.capacity_rps, lat[i]) for i, t in enumerate(measured)])
        head = (
            f"<h4>Tuning run #{run.id} ({escape(run.state)}): {len(measured)} trials measured"
            f"{', best ' + _diff(res['best']['flags']) if res.get('best') else ''}</h4>"
            f"<p>workload {escape(str(run.workload))}; SLO {escape(str(run.slo))}"
            + (f"; {escape(res['verdict'])}" if res.get("verdict") else "")
            + "</p>"
        )
        title = f"Tuning run #{run.id}: capacity within the SLO against P99 E2E"
        plot = figure_html(
            trials_scatter(title, [(lat[i], t.capacity_rps, front[i], _diff(t.flags)) for i, t in enumerate(measured)]),
            title,
            "plot scatter",
        )
        ranked = sorted(trs, key=lambda t: (t.status != TrialStatus.MEASURED, -(t.capacity_rps or 0.0)))
        on = {t.id for i, t in enumerate(measured) if front[i]}
        rows = "".join(
            f'<tr class="trial-row" data-status="{escape(t.status)}"><td>{t.seq}</td><td>{escape(_diff(t.flags))}</td>'
            f"<td>{_fmt(t.capacity_rps if t.status == TrialStatus.MEASURED else None, 'per_s')}</td>"
            f"<td>{_fmt(t.detail.get('ttft_p99'), 's')}</td><td>{_fmt(t.detail.get('e2e_p99'), 's')}</td>"
            f"<td>{escape(t.status)}{' (' + escape(t.seed) + ')' if t.seed else ''}</td>"
            f"<td>{'yes' if t.id in on else ''}</td>"
            f"<td>{escape(str(t.detail.get('note') or t.detail.get('reason') or t.detail.get('server_error') or ''))}"
            "</td></tr>"
            for t in ranked
        )
        parts.append(
            f'<div class="tune" data-run="{run.id}">{head}{plot}<table class="trials"><tr><th>#</th>'
            "<th>flags</th><th>capacity within the SLO</th><th>P99 TTFT</th><th>P99 E2E</th><th>status</th>"
            f"<th>Pareto front</th><th>note</th></tr>{rows}</table></div>"
        )
    return "".join(parts)


def _target_html(rep: TargetReport) -> str:
    marks = _markers(rep)
    parts = [
        f'<section class="target" data-target="{escape(rep.target)}"><h2>{escape(rep.target)} '
        f"<small>({escape(rep.backend)}; signals over {rep.window_s:g} s windows)</small></h2>"
    ]
    if not rep.series:
        parts.append('<p class="none">No samples stored for this target in this period.</p>')
    for (engine, model), plots in sorted(rep.series.items()):
        parts.append(f"<h3>engine {escape(engine)} — model {escape(model)}</h3>")
        for plot in PLOTS:
            lines = plots.get(plot.key, {})
            if any(v is not None for pts in lines.values() for _, v in pts) or plot.key in ("kv", "queue"):
                parts.append(
                    figure_html(
                        time_series(plot.title, plot.unit, lines, rep.start_ms, rep.end_ms, marks), plot.title, "plot"
                    )
                )
    parts.append(
        f"<h3>Alerts</h3>{_alerts_html(rep)}<h3>Applies</h3>{_applies_html(rep)}"
        f"<h3>Tuning</h3>{_tuning_html(rep)}</section>"
    )
    return "".join(parts)


_CSS = """
body{font-family:sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px} h2{border-bottom:1px solid #ccc;padding-bottom:4px} small{color:#666;font-weight:normal}
div.plot{margin:10px 0}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}
.kept{color:#2ca02c} .rolled_back,.failed{color:#d62728} .none{color:#666}
.key span{display:inline-block;width:14px;height:3px;margin:0 4px 3px 12px}
"""


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.js as the installed plotly package ships it (inlined once per report)."""
    return str(get_plotlyjs())


def figure_html(fig: go.Figure, title: str, css_class: str) -> str:
    """One chart: its figure as JSON (``</`` escaped so that no string in it can close the script) and the div
    the page's script draws it into."""
    spec = fig.to_json(validate=False).replace("</", "<\\/")
    return (
        f'<div class="{css_class}" data-plot="{escape(title)}"><script type="application/json" class="figure">'
        f'{spec}</script><div class="chart" style="width:900px;height:260px"></div></div>'
    )


# Draws every chart: drag to zoom, double-click to reset, hover for values.
_DRAW = """
for (const div of document.querySelectorAll("div.plot")) {
  const fig = JSON.parse(div.querySelector("script.figure").textContent);
  Plotly.newPlot(div.querySelector("div.chart"), fig.data, fig.layout,
                 {displayModeBar: false, responsive: false});
}
"""


def render_html(reports: list[TargetReport], *, title: str, generated_at: float) -> str:
    key = "".join(f'<span style="background:{c}"></span>{k}' for k, c in MARKER_COLORS.items())
    body = "".join(_target_html(r) for r in reports) or '<p class="none">No targets in the store.</p>'
    start = min((r.start_ms for r in reports), default=int(generated_at * 1000))
    end = max((r.end_ms for r in reports), default=int(generated_at * 1000))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_CSS}</style>"
        f'<script type="text/javascript" class="plotly-js">{plotly_js()}</script></head><body>'
        f"<h1>{escape(title)}</h1><p>{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(start / 1000))} to "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(end / 1000))} UTC. "
        f'Dashed lines:<span class="key">{key}</span></p>{body}'
        f"<footer><p>generated by tuner at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(generated_at))} "
        f"UTC</p></footer><script>{_DRAW}</script></body></html>\n"
    )


def plot_titles() -> list[str]:
    return [p.title for p in PLOTS]


__all__ += ["plot_titles", "Plot"]
