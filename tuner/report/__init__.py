"""``tuner report``: one self-contained HTML file of a target's signals, alerts and applies, from the store."""

from tuner.report.data import PLOTS, TargetReport, collect
from tuner.report.html import render_html, svg_plot

__all__ = ["PLOTS", "TargetReport", "collect", "render_html", "svg_plot"]
