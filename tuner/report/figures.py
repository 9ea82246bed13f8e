"""The report's charts as plotly figures (rendered in the page by plotly.js, embedded once).

Plotly rather than matplotlib: a report is read in a browser, and an operator looking at a latency spike wants to
zoom into its minute and hover a point for its value, which a static image cannot give; plotly's figure is data
(JSON) that one embedded copy of plotly.js draws, so the report stays one self-contained file, and tests read the
figure's data from the page as well as what the browser drew.

Time axes are plotly ``date`` axes fed with milliseconds since the epoch (UTC); a ``None`` value is a gap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import plotly.graph_objects as go

__all__ = ["COLORS", "MARKER_COLORS", "WIDTH", "HEIGHT", "time_series", "trials_scatter", "pareto"]

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
MARKER_COLORS = {"alert": "#ff7f0e", "apply": "#2ca02c", "rollback": "#d62728"}
WIDTH, HEIGHT = 900, 260
_MARGIN = {"l": 70, "r": 30, "t": 40, "b": 40}
_Y_FORMAT = {  # unit -> (tick format, tick suffix, hover format)
    "s": ("~r", " s", ".3~r"),
    "ratio": (".3~%", "", ".2~%"),
    "per_s": ("~s", "/s", ".1f"),
    "count": ("d", "", "d"),
}


def _layout(title: str, **extra: object) -> go.Layout:
    return go.Layout(
        title={"text": title, "x": 0.0, "xanchor": "left", "font": {"size": 14}},
        width=WIDTH,
        height=HEIGHT,
        autosize=False,
        margin=_MARGIN,
        plot_bgcolor="#fafafa",
        paper_bgcolor="#ffffff",
        legend={
            "orientation": "h",
            "x": 0.0,
            "y": 1.0,
            "yanchor": "bottom",
            "xanchor": "left",
            "font": {"size": 11},
            "bgcolor": "rgba(255,255,255,0)",
        },
        **{"hovermode": "x unified", **extra},
    )


def time_series(
    title: str,
    unit: str,
    lines: Mapping[str, Sequence[tuple[int, float | None]]],
    start_ms: int,
    end_ms: int,
    markers: Iterable[tuple[int, str, str]] = (),
) -> go.Figure:
    """A line chart over [start_ms, end_ms]: ``lines`` legend -> [(ts_ms, value or None for a gap)]; ``markers``
    (ts_ms, kind in MARKER_COLORS, label) drawn as dashed vertical lines, each hoverable at its top."""
    tick, suffix, hover = _Y_FORMAT.get(unit, ("~r", "", ".3~r"))
    values = [v for pts in lines.values() for _, v in pts if v is not None and math.isfinite(v)]
    top = max(values, default=0.0)
    yrange = [0.0, max(1.0, top * 1.1)] if unit == "ratio" and top > 0.5 else [0.0, top * 1.1 or 1.0]
    fig = go.Figure(
        layout=_layout(
            title,
            xaxis={"type": "date", "range": [start_ms, end_ms], "showgrid": False},
            yaxis={
                "range": yrange,
                "tickformat": tick,
                "ticksuffix": suffix,
                "gridcolor": "#e0e0e0",
                "rangemode": "tozero",
            },
            yaxis2={"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True},
        )
    )
    for i, (legend, pts) in enumerate(lines.items()):
        fig.add_trace(
            go.Scatter(
                x=[t for t, _ in pts],
                y=[v for _, v in pts],
                name=legend,
                mode="lines+markers" if sum(v is not None for _, v in pts) == 1 else "lines",
                line={"color": COLORS[i % len(COLORS)], "width": 2},
                hovertemplate=f"%{{y:{hover}}}{suffix}",
                meta="series",
            )
        )
    shown: set[str] = set()
    by_kind: dict[str, list[tuple[int, str]]] = {}
    for ts, kind, label in markers:
        if start_ms <= ts <= end_ms:
            fig.add_shape(
                type="line",
                x0=ts,
                x1=ts,
                xref="x",
                y0=0,
                y1=1,
                yref="paper",
                name=kind,
                line={"color": MARKER_COLORS[kind], "width": 2, "dash": "dash"},
            )
            by_kind.setdefault(kind, []).append((ts, label))
    for kind, marks in by_kind.items():  # a hoverable point atop each line, one legend entry per kind
        fig.add_trace(
            go.Scatter(
                x=[t for t, _ in marks],
                y=[0.97] * len(marks),
                yaxis="y2",
                mode="markers",
                name=kind,
                marker={"color": MARKER_COLORS[kind], "symbol": "triangle-down", "size": 9},
                text=[label for _, label in marks],
                hovertemplate="%{text}<extra></extra>",
                showlegend=kind not in shown,
                meta=f"marker {kind}",
            )
        )
        shown.add(kind)
    if not values:
        fig.add_annotation(
            text="no data",
            x=0.5,
            y=0.5,
            xref="paper",
            yref="paper",
            showarrow=False,
            font={"size": 14, "color": "#999"},
        )
    return fig


def pareto(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For (capacity, P99 latency) points: whether each is on the front (no other has more capacity and no more
    latency, or as much capacity and less latency)."""
    out = []
    for c, lat in points:
        out.append(not any((c2 > c and l2 <= lat) or (c2 >= c and l2 < lat) for c2, l2 in points))
    return out


def trials_scatter(title: str, pts: Sequence[tuple[float, float, bool, str]]) -> go.Figure:
    """Capacity within the SLO (y) against P99 E2E at that rate (x), one point per measured trial: ``pts``
    (x, y, on the front, flags); the front is joined, left to right."""
    fig = go.Figure(
        layout=_layout(
            title,
            hovermode="closest",
            xaxis={
                "title": {"text": "P99 E2E at capacity"},
                "ticksuffix": " s",
                "rangemode": "tozero",
                "gridcolor": "#e0e0e0",
            },
            yaxis={"title": {"text": "req/s within the SLO"}, "rangemode": "tozero", "gridcolor": "#e0e0e0"},
        )
    )
    off = [p for p in pts if not p[2]]
    front = sorted((p for p in pts if p[2]), key=lambda p: p[0])
    fig.add_trace(
        go.Scatter(
            x=[p[0] for p in off],
            y=[p[1] for p in off],
            text=[p[3] for p in off],
            mode="markers",
            name="trial",
            marker={"color": COLORS[0], "size": 10},
            meta="trial",
            hovertemplate="%{text}<br>%{y:.3~r} req/s, P99 E2E %{x:.3~r} s<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[p[0] for p in front],
            y=[p[1] for p in front],
            text=[p[3] for p in front],
            mode="lines+markers",
            name="Pareto front",
            meta="front",
            line={"color": COLORS[2], "width": 1.5},
            marker={"color": COLORS[2], "size": 10},
            hovertemplate="%{text}<br>%{y:.3~r} req/s, P99 E2E %{x:.3~r} s<extra></extra>",
        )
    )
    return fig
