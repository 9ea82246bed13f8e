"""Every PromQL expression a dashboard holds, and the metric names each one reads.

Used by the tests (each query parses in promtool, reads only metric names a real server or tuner serves,
and returns data from a real Prometheus) and by ``tuner dashboards generate`` to list what it wrote.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Query", "queries", "metric_names", "substitute", "DEFAULT_VARIABLES"]

# Grafana's variables → what stands in for them outside Grafana (all targets, all models).
DEFAULT_VARIABLES = {
    "target": ".*",
    "model": ".*",
    "gpu": ".*",
    "__rate_interval": "30s",
    "__interval": "15s",
    "datasource": "",
}


@dataclass(frozen=True)
class Query:
    dashboard: str  # uid
    where: str  # panel title and refId, "annotation NAME" or "variable NAME"
    expr: str  # PromQL (a label_values() variable query is reduced to its series selector)
    kind: str  # "panel" | "annotation" | "variable"


_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<sel>.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*\Z", re.S)


def queries(model: Mapping[str, Any]) -> Iterator[Query]:
    """Panel targets (rows' nested panels too), annotations and query variables of one dashboard model."""
    uid = model["uid"]

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels") or [])

    for p in panels(model.get("panels") or []):
        for t in p.get("targets") or []:
            if t.get("expr"):
                yield Query(uid, f"{p.get('title')} [{t.get('refId')}]", t["expr"], "panel")
    for a in (model.get("annotations") or {}).get("list") or []:
        if a.get("expr"):
            yield Query(uid, f"annotation {a.get('name')}", a["expr"], "annotation")
    for v in (model.get("templating") or {}).get("list") or []:
        q = v.get("query")
        if v.get("type") == "query" and isinstance(q, str):
            m = _LABEL_VALUES.match(q)
            yield Query(uid, f"variable {v.get('name')}", m["sel"] if m else q, "variable")


def substitute(expr: str, values: Mapping[str, str] = DEFAULT_VARIABLES) -> str:
    """Replace Grafana's ``$name`` / ``${name}`` variables; an unknown variable raises KeyError naming it."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no value for dashboard variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, expr)


# PromQL words that look like identifiers but are no metric name.
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    "inf",
    "nan",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:])(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers that are not functions, keywords or label names.

    Label matchers, strings, range/subquery brackets and grouping label lists are removed first, so
    ``sum by (le) (rate(x_bucket{a="b"}[5m]))`` gives ``{"x_bucket"}``. ``{__name__=...}`` selectors are
    not supported (the dashboards do not use them).
    """
    text = _STRING.sub('""', expr)
    if "__name__" in text:
        raise ValueError(f"__name__ matchers are not supported: {expr!r}")
    text = _BRACES.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names
