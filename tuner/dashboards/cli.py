"""``tuner dashboards generate`` and ``tuner dashboards push``."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from tuner.errors import ConfigError

__all__ = ["add_parsers"]

TOKEN_ENV = "GRAFANA_TOKEN"


def cmd_generate(args: argparse.Namespace) -> int:
    from tuner.dashboards.build import build_dashboards, to_json
    from tuner.dashboards.queries import queries

    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise ConfigError(str(out), "-o", "is a file; give a directory for the dashboards")
    out.mkdir(parents=True, exist_ok=True)
    for uid, model in build_dashboards().items():
        path = out / f"{uid}.json"
        path.write_text(to_json(model))
        n = sum(1 for _ in queries(model))
        print(f"{path}: {model['title']!r}, {len(_panels(model))} panels, {n} queries")
    return 0


def _panels(model: dict) -> list[dict]:
    return [p for p in model.get("panels", []) if p.get("type") != "row"]


def cmd_push(args: argparse.Namespace) -> int:
    from tuner.dashboards.build import build_dashboards
    from tuner.dashboards.push import push_dashboards

    token = os.environ.get(TOKEN_ENV)
    if not token:
        raise ConfigError(f"${TOKEN_ENV}", "", "not set; export a Grafana service-account token in "
                          f"{TOKEN_ENV} (it is never taken on the command line)")
    if args.from_dir:
        files = sorted(Path(args.from_dir).glob("*.json"))
        if not files:
            raise ConfigError(args.from_dir, "--from", "no *.json dashboards there; run `tuner dashboards generate`")
        dashboards = {}
        for f in files:
            try:
                model = json.loads(f.read_text())
                dashboards[model["uid"]] = model
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(str(f), "uid", f"not a dashboard JSON with a uid ({exc})") from None
    else:
        dashboards = build_dashboards()
    result = push_dashboards(args.grafana_url, token, dashboards, folder=args.folder)
    verb = "created" if result.folder_created else "found"
    print(f"folder {args.folder!r} ({result.folder_uid}) {verb}")
    for uid, url in result.dashboards:
        print(f"  {uid}: {args.grafana_url.rstrip('/')}{url}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("dashboards", help="Grafana dashboards built from code: generate the JSON, push to Grafana")
    dsub = d.add_subparsers(dest="dashboards_command", required=True, metavar="SUBCOMMAND")
    g = dsub.add_parser("generate", help="write every dashboard as JSON (vLLM, GPU, llama-server, tuner)")
    g.add_argument("-o", "--output", default="dashboards", help="directory (default ./dashboards)")
    g.set_defaults(func=cmd_generate)
    p = dsub.add_parser("push", help=f"upload the dashboards to Grafana (token from ${TOKEN_ENV}); creates the "
                        "folder if missing, overwrites dashboards with the same uid")
    p.add_argument("--grafana-url", required=True, help="e.g. http://127.0.0.1:3000")
    p.add_argument("--folder", default="tuner", help="folder title (default tuner)")
    p.add_argument("--from", dest="from_dir", help="push the JSON files of this directory instead of building them")
    p.set_defaults(func=cmd_push)
