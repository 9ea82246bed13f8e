"""``tuner report``: one self-contained HTML file of a target's signals, alerts, applies and tuning runs."""

from tuner.report.data import PLOTS, TargetReport, collect
from tuner.report.html import render_html

__all__ = ["PLOTS", "TargetReport", "collect", "render_html"]
