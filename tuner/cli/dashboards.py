"""``tuner dashboards generate`` and ``tuner dashboards push`` (use cases: tuner/app/dashboards.py; no config)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from tuner.app import dashboards as dashboards_app
from tuner.errors import ConfigError

__all__ = ["add_parsers"]

TOKEN_ENV = "GRAFANA_TOKEN"


def cmd_generate(args: argparse.Namespace) -> int:
    for w in dashboards_app.generate(Path(args.output)):
        print(f"{w.path}: {w.title!r}, {w.panels} panels, {w.queries} queries")
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    token = os.environ.get(TOKEN_ENV)
    if not token:
        raise ConfigError(
            f"${TOKEN_ENV}",
            "",
            f"not set; export a Grafana service-account token in {TOKEN_ENV} (it is never taken on the command line)",
        )
    result = dashboards_app.push(args.grafana_url, token, folder=args.folder, from_dir=args.from_dir)
    verb = "created" if result.folder_created else "found"
    print(f"folder {args.folder!r} ({result.folder_uid}) {verb}")
    for uid, url in result.dashboards:
        print(f"  {uid}: {args.grafana_url.rstrip('/')}{url}")
    return 0


def add_parsers(sub: Any) -> None:
    d = sub.add_parser("dashboards", help="Grafana dashboards built from code: generate the JSON, push to Grafana")
    dsub = d.add_subparsers(dest="dashboards_command", required=True, metavar="SUBCOMMAND")
    g = dsub.add_parser("generate", help="write every dashboard as JSON (vLLM, GPU, llama-server, tuner)")
    g.add_argument("-o", "--output", default="dashboards", help="directory (default ./dashboards)")
    g.set_defaults(func=cmd_generate)
    p = dsub.add_parser(
        "push",
        help=f"upload the dashboards to Grafana (token from ${TOKEN_ENV}); creates the "
        "folder if missing, overwrites dashboards with the same uid",
    )
    p.add_argument("--grafana-url", required=True, help="e.g. http://127.0.0.1:3000")
    p.add_argument("--folder", default="tuner", help="folder title (default tuner)")
    p.add_argument("--from", dest="from_dir", help="push the JSON files of this directory instead of building them")
    p.set_defaults(func=cmd_push)
