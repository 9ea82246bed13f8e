"""One self-contained HTML file: inline CSS and SVG drawn here, no script, no fetch of anything.

Each plot is an ``<svg class="plot">`` with one ``<path class="series">`` per line, and ``<line class="marker
alert|apply|rollback">`` for alert and apply events; tables list the alerts and, per apply, the KPIs before and
after.
"""

from __future__ import annotations

import math
import time
from html import escape
from typing import Any, Iterable, Mapping, Sequence

from tuner.report.data import PLOTS, Plot, TargetReport

__all__ = ["render_html", "svg_plot", "svg_scatter", "pareto"]

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
MARKER_COLORS = {"alert": "#ff7f0e", "apply": "#2ca02c", "rollback": "#d62728"}
W, H, LEFT, RIGHT, TOP, BOTTOM = 900, 240, 70, 36, 28, 36
# The verdict's KPIs (tuner/apply/verdict.py), each with the direction that is better.
KPI_LABELS = {"offered_rps": ("Offered load, req/s (the load, not a KPI)", "per_s"),
              "capacity_rps": ("Capacity, req/s (higher is better)", "per_s"),
              "slo_goodput_rps": ("SLO goodput, req/s (higher is better)", "per_s"),
              "slo_attainment": ("SLO attainment (higher is better)", "ratio"),
              "ttft_p99": ("TTFT P99 (lower is better)", "s"), "e2e_p99": ("E2E P99 (lower is better)", "s"),
              "capacity_tokens_per_s": ("Capacity, tokens/s (higher is better)", "per_s")}


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


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(v))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= v)


def svg_plot(title: str, unit: str, lines: Mapping[str, Sequence[tuple[int, float | None]]], start_ms: int, end_ms: int,
             markers: Iterable[tuple[int, str, str]] = (), css_class: str = "plot") -> str:
    """A line chart: ``lines`` legend -> [(ts_ms, value or None for a gap)]; markers (ts_ms, kind, label)."""
    values = [v for pts in lines.values() for _, v in pts if v is not None]
    ymax = _nice_max(max(values)) if values else 1.0
    if unit == "ratio":
        ymax = max(ymax, 1.0) if values and max(values) > 0.5 else ymax
    span = max(1, end_ms - start_ms)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(t: int) -> float:
        return LEFT + (t - start_ms) / span * pw

    def y(v: float) -> float:
        return TOP + ph - min(v, ymax) / ymax * ph

    out = [f'<svg class="{css_class}" data-plot="{escape(title)}" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           f'role="img" aria-label="{escape(title)}">',
           f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#999"/>',
           f'<text x="{LEFT}" y="18" class="title">{escape(title)}</text>']
    for i in range(5):
        v = ymax * i / 4
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e0e0e0"/>'
                   f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end" class="tick">{_fmt(v, unit, ymax)}</text>')
    for i in range(6):
        t = start_ms + span * i // 5
        out.append(f'<text x="{x(t):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle" class="tick">'
                   f'{_time(t, span / 1000)}</text>')
    for ts, kind, label in markers:
        if start_ms <= ts <= end_ms:
            out.append(f'<line class="marker {kind}" x1="{x(ts):.1f}" x2="{x(ts):.1f}" y1="{TOP}" y2="{TOP + ph}" '
                       f'stroke="{MARKER_COLORS[kind]}" stroke-width="2" stroke-dasharray="5,3">'
                       f'<title>{escape(label)}</title></line>')
    for i, (legend, pts) in enumerate(lines.items()):
        color = COLORS[i % len(COLORS)]
        d, pen = [], "M"
        for t, point in pts:
            if point is None:
                pen = "M"
                continue
            d.append(f"{pen}{x(t):.1f},{y(point):.1f}")
            pen = "L"
        n = sum(1 for _, v in pts if v is not None)
        if d:
            out.append(f'<path class="series" data-legend="{escape(legend)}" data-points="{n}" d="{" ".join(d)}" '
                       f'fill="none" stroke="{color}" stroke-width="2"/>')
            if n == 1:  # a lone point draws no line: show it as a dot
                cx, cy = d[0][1:].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>')
        lx = LEFT + 10 + i * 170
        out.append(f'<rect x="{lx}" y="{TOP + 6}" width="12" height="3" fill="{color}"/>'
                   f'<text x="{lx + 16}" y="{TOP + 11}" class="legend">{escape(legend)}</text>')
    if not values:
        out.append(f'<text x="{LEFT + pw / 2}" y="{TOP + ph / 2}" text-anchor="middle" class="empty">no data</text>')
    out.append("</svg>")
    return "".join(out)


def _markers(rep: TargetReport) -> list[tuple[int, str, str]]:
    marks = [(a.ts_ms, "alert", f"{a.alertname} {a.from_state} -> {a.to_state}")
             for a in rep.alerts if a.to_state == "firing"]
    for ap in rep.applies:
        marks.append((ap.created_ms, "apply", f"apply #{ap.id} {_diff(ap.diff)}"))
        if ap.outcome in ("rolled_back", "inconclusive", "failed"):
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
        head = (f'<h4>Apply #{ap.id} ({escape(getattr(ap, "kind", "apply"))}): {escape(_diff(ap.diff))} — '
                f'<span class="outcome {escape(ap.outcome or "running")}">{escape(ap.outcome or ap.state)}</span></h4>'
                f'<p>started {_time(ap.created_ms, 86400 * 3)} UTC, last step {_time(ap.updated_ms, 86400 * 3)} UTC'
                + (f", recommendation #{ap.recommendation_id}" if ap.recommendation_id is not None else "")
                + (f". {escape(ap.note)}" if ap.note else "") + "</p>")
        rows = "".join(
            f'<tr class="kpi" data-apply="{ap.id}" data-kpi="{k}"><td>{label}</td>'
            f'<td>{_fmt(ap.baseline.get(k), unit)}</td><td>{_fmt(ap.after.get(k), unit)}</td>'
            f'<td>{_change(ap.baseline.get(k), ap.after.get(k))}</td></tr>'
            for k, (label, unit) in KPI_LABELS.items())
        parts.append(f'<div class="apply" data-apply="{ap.id}">{head}<table class="beforeafter">'
                     f"<tr><th>KPI</th><th>before</th><th>after</th><th>change</th></tr>{rows}</table>"
                     f"{_apply_view_html(rep, ap)}</div>")
    return "".join(parts)


def _apply_view_html(rep: TargetReport, ap: Any) -> str:
    """The apply's own before/after plots: its start and end marked, the span from a baseline before to 30 s after."""
    view = rep.apply_views.get(ap.id)
    if view is None:
        return ""
    marks = [(ap.created_ms, "apply", f"apply #{ap.id} started")]
    if ap.outcome:
        marks.append((ap.updated_ms, "rollback" if ap.outcome != "kept" else "apply", f"apply #{ap.id} {ap.outcome}"))
    out = []
    for (engine, model), plots in sorted(view.series.items()):
        for plot in PLOTS:
            if plot.key in plots:
                out.append(svg_plot(f"apply #{ap.id}: {plot.title} (engine {engine})", plot.unit, plots[plot.key],
                                    view.start_ms, view.end_ms, marks, css_class="plot apply-view"))
    return "".join(out)


def _alerts_html(rep: TargetReport) -> str:
    if not rep.alerts:
        return '<p class="none">No alert state changes in this period.</p>'
    rows = "".join(f'<tr class="alert-event"><td>{_time(a.ts_ms, 86400 * 3)}</td><td>{escape(a.alertname)}</td>'
                   f"<td>{escape(a.from_state)} → {escape(a.to_state)}</td><td>{a.value:g}</td>"
                   f'<td>{escape(a.labels.get("severity", ""))}</td></tr>' for a in rep.alerts)
    return ('<table class="alerts"><tr><th>time (UTC)</th><th>alert</th><th>change</th><th>value</th>'
            f"<th>severity</th></tr>{rows}</table>")


def pareto(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For (capacity, P99 latency) points: whether each is on the front (no other has more capacity and no more
    latency, or as much capacity and less latency)."""
    out = []
    for c, lat in points:
        out.append(not any((c2 > c and l2 <= lat) or (c2 >= c and l2 < lat) for c2, l2 in points))
    return out


def svg_scatter(title: str, pts: Sequence[tuple[float, float, bool, str]]) -> str:
    """Capacity (y) against P99 E2E (x) per trial: ``pts`` (x, y, on the front, label); the front is joined."""
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    xmax = _nice_max(max((p[0] for p in pts), default=1.0))
    ymax = _nice_max(max((p[1] for p in pts), default=1.0))

    def x(v: float) -> float:
        return LEFT + pw * v / xmax

    def y(v: float) -> float:
        return TOP + ph * (1 - v / ymax)
    out = [f'<svg class="plot scatter" data-plot="{escape(title)}" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" role="img" aria-label="{escape(title)}">',
           f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#999"/>',
           f'<text x="{LEFT}" y="18" class="title">{escape(title)}</text>']
    for i in range(5):
        out.append(f'<text x="{LEFT - 6}" y="{y(ymax * i / 4) + 4:.1f}" class="tick" text-anchor="end">'
                   f'{ymax * i / 4:.3g}</text>')
        out.append(f'<text x="{x(xmax * i / 4):.1f}" y="{H - BOTTOM + 16}" class="tick" text-anchor="middle">'
                   f'{xmax * i / 4:.3g} s</text>')
    out.append(f'<text x="{W - RIGHT}" y="{H - 4}" class="tick" text-anchor="end">P99 E2E at capacity</text>'
               f'<text x="12" y="{TOP + ph / 2}" class="tick" transform="rotate(-90 12 {TOP + ph / 2})">'
               "req/s within the SLO</text>")
    front = sorted((p for p in pts if p[2]), key=lambda p: p[0])
    if len(front) > 1:
        d = " ".join(f"{'M' if i == 0 else 'L'}{x(p[0]):.1f},{y(p[1]):.1f}" for i, p in enumerate(front))
        out.append(f'<path class="front" d="{d}" fill="none" stroke="{COLORS[2]}" stroke-width="1.5"/>')
    for px, py, on_front, label in pts:
        out.append(f'<circle class="trial{" front" if on_front else ""}" cx="{x(px):.1f}" cy="{y(py):.1f}" r="5" '
                   f'fill="{COLORS[2] if on_front else COLORS[0]}"><title>{escape(label)}</title></circle>')
    out.append("</svg>")
    return "".join(out)


def _tuning_html(rep: TargetReport) -> str:
    if not rep.tunes:
        return '<p class="none">No tuning runs in this period.</p>'
    parts = []
    for run, trs in rep.tunes:
        res = run.result or {}
        measured = [t for t in trs if t.status == "measured" and t.capacity_rps is not None]
        lat = [float(t.detail.get("e2e_p99") or 0.0) for t in measured]
        front = pareto([(t.capacity_rps, lat[i]) for i, t in enumerate(measured)])
        head = (f'<h4>Tuning run #{run.id} ({escape(run.state)}): {len(measured)} trials measured'
                f'{", best " + _diff(res["best"]["flags"]) if res.get("best") else ""}</h4>'
                f'<p>workload {escape(str(run.workload))}; SLO {escape(str(run.slo))}'
                + (f'; {escape(res["verdict"])}' if res.get("verdict") else "") + "</p>")
        plot = svg_scatter(f"Tuning run #{run.id}: capacity within the SLO against P99 E2E",
                           [(lat[i], t.capacity_rps, front[i], _diff(t.flags)) for i, t in enumerate(measured)])
        ranked = sorted(trs, key=lambda t: (t.status != "measured", -(t.capacity_rps or 0.0)))
        on = {t.id for i, t in enumerate(measured) if front[i]}
        rows = "".join(
            f'<tr class="trial-row" data-status="{escape(t.status)}"><td>{t.seq}</td><td>{escape(_diff(t.flags))}</td>'
            f'<td>{_fmt(t.capacity_rps if t.status == "measured" else None, "per_s")}</td>'
            f'<td>{_fmt(t.detail.get("ttft_p99"), "s")}</td><td>{_fmt(t.detail.get("e2e_p99"), "s")}</td>'
            f'<td>{escape(t.status)}{" (" + escape(t.seed) + ")" if t.seed else ""}</td>'
            f'<td>{"yes" if t.id in on else ""}</td>'
            f'<td>{escape(str(t.detail.get("note") or t.detail.get("reason") or t.detail.get("server_error") or ""))}'
            "</td></tr>" for t in ranked)
        parts.append(f'<div class="tune" data-run="{run.id}">{head}{plot}<table class="trials"><tr><th>#</th>'
                     "<th>flags</th><th>capacity within the SLO</th><th>P99 TTFT</th><th>P99 E2E</th><th>status</th>"
                     f"<th>Pareto front</th><th>note</th></tr>{rows}</table></div>")
    return "".join(parts)


def _target_html(rep: TargetReport) -> str:
    marks = _markers(rep)
    parts = [f'<section class="target" data-target="{escape(rep.target)}"><h2>{escape(rep.target)} '
             f'<small>({escape(rep.backend)}; signals over {rep.window_s:g} s windows)</small></h2>']
    if not rep.series:
        parts.append('<p class="none">No samples stored for this target in this period.</p>')
    for (engine, model), plots in sorted(rep.series.items()):
        parts.append(f"<h3>engine {escape(engine)} — model {escape(model)}</h3>")
        for plot in PLOTS:
            lines = plots.get(plot.key, {})
            if any(v is not None for pts in lines.values() for _, v in pts) or plot.key in ("kv", "queue"):
                parts.append(svg_plot(plot.title, plot.unit, lines, rep.start_ms, rep.end_ms, marks))
    parts.append(f"<h3>Alerts</h3>{_alerts_html(rep)}<h3>Applies</h3>{_applies_html(rep)}"
                 f"<h3>Tuning</h3>{_tuning_html(rep)}</section>")
    return "".join(parts)


_CSS = """
body{font-family:sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px} h2{border-bottom:1px solid #ccc;padding-bottom:4px} small{color:#666;font-weight:normal}
svg.plot{display:block;margin:10px 0} .title{font-size:14px;font-weight:bold} .tick{font-size:11px;fill:#555}
.legend{font-size:12px} .empty{font-size:14px;fill:#999}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}
.kept{color:#2ca02c} .rolled_back,.failed{color:#d62728} .none{color:#666}
.key span{display:inline-block;width:14px;height:3px;margin:0 4px 3px 12px}
"""


def render_html(reports: list[TargetReport], *, title: str, generated_at: float) -> str:
    key = "".join(f'<span style="background:{c}"></span>{k}' for k, c in MARKER_COLORS.items())
    body = "".join(_target_html(r) for r in reports) or '<p class="none">No targets in the store.</p>'
    start = min((r.start_ms for r in reports), default=int(generated_at * 1000))
    end = max((r.end_ms for r in reports), default=int(generated_at * 1000))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{escape(title)}</h1><p>{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(start / 1000))} to "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(end / 1000))} UTC. "
            f'Dashed lines:<span class="key">{key}</span></p>{body}'
            f"<footer><p>generated by tuner at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(generated_at))} "
            "UTC</p></footer></body></html>\n")


def plot_titles() -> list[str]:
    return [p.title for p in PLOTS]


__all__ += ["plot_titles", "Plot"]
