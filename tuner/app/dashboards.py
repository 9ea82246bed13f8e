"""Grafana dashboards built from code: write them as JSON, or push them to a Grafana (no config needed)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.dashboards.build import build_dashboards, to_json
from tuner.dashboards.push import PushResult, push_dashboards
from tuner.dashboards.queries import queries
from tuner.errors import ConfigError

__all__ = ["Written", "generate", "push"]


@dataclass(frozen=True)
class Written:
    path: Path
    title: str
    panels: int
    queries: int


def generate(out: Path) -> list[Written]:
    if out.exists() and not out.is_dir():
        raise ConfigError(str(out), "-o", "is a file; give a directory for the dashboards")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for uid, model in build_dashboards().items():
        path = out / f"{uid}.json"
        path.write_text(to_json(model))
        panels = [p for p in model.get("panels", []) if p.get("type") != "row"]
        written.append(Written(path, model["title"], len(panels), sum(1 for _ in queries(model))))
    return written


def _from_dir(directory: str) -> dict[str, Any]:
    files = sorted(Path(directory).glob("*.json"))
    if not files:
        raise ConfigError(directory, "--from", "no *.json dashboards there; run `tuner dashboards generate`")
    dashboards = {}
    for f in files:
        try:
            model = json.loads(f.read_text())
            dashboards[model["uid"]] = model
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(str(f), "uid", f"not a dashboard JSON with a uid ({exc})") from None
    return dashboards


def push(grafana_url: str, token: str, *, folder: str, from_dir: str | None = None) -> PushResult:
    """Upload the dashboards (built now, or the JSON files of ``from_dir``); the folder is created if missing."""
    return push_dashboards(grafana_url, token, _from_dir(from_dir) if from_dir else build_dashboards(), folder=folder)
