"""Grafana dashboards built in code (build), their PromQL (queries), upload to Grafana (push), CLI (cli)."""

from tuner.dashboards.build import build_dashboards, to_json
from tuner.dashboards.queries import Query, metric_names, queries, substitute

__all__ = ["build_dashboards", "to_json", "Query", "queries", "metric_names", "substitute"]
