"""``tuner alerts ...``: list, history, check, export, test, signals (use cases: tuner/app/alerts.py).
``check``, ``export``, ``test`` and ``signals`` need no config: without one they read the default pack."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from tuner.app import alerts as alerts_app
from tuner.cli.common import COUNT, optional_session, session, table, when
from tuner.errors import ConfigError
from tuner.rules.signals import SIGNALS

__all__ = ["add_parsers"]


def cmd_list(args: argparse.Namespace) -> int:
    alerts = alerts_app.current(session(args), include_inactive=args.all)
    if args.json:
        print(json.dumps([a.__dict__ for a in alerts]))
        return 0
    rows = [["STATE", "ALERT", "LABELS", "VALUE", "ACTIVE SINCE", "FIRING SINCE", "SUMMARY"]]
    for a in alerts:
        labels = ",".join(f"{k}={v}" for k, v in sorted(a.labels.items()) if k != "alertname")
        rows.append(
            [
                a.state,
                a.labels.get("alertname", a.rule),
                labels,
                f"{a.value:.4g}",
                when(a.active_at_ms),
                when(a.fired_at_ms),
                a.annotations.get("summary", "")[:70],
            ]
        )
    print(table(rows) if len(rows) > 1 else "no active alerts")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    events = alerts_app.history(session(args), limit=args.limit)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "ts_ms": e.ts_ms,
                        "rule": e.rule,
                        "labels": json.loads(e.labels),
                        "from": e.from_state,
                        "to": e.to_state,
                        "value": e.value,
                    }
                    for e in events
                ]
            )
        )
        return 0
    rows = [["TIME (UTC)", "RULE", "FROM", "TO", "VALUE", "LABELS"]]
    for e in events:
        labels = ",".join(f"{k}={v}" for k, v in sorted(json.loads(e.labels).items()) if k != "alertname")
        rows.append([when(e.ts_ms), e.rule, e.from_state, e.to_state, f"{e.value:.4g}", labels])
    print(table(rows) if len(rows) > 1 else "no alert history yet")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    files, rules = alerts_app.rules(optional_session(args), args.files)
    print(f"{len(rules.rules)} rules in {len(rules.groups)} groups OK: {', '.join(files)}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    labels = {}
    for item in args.label or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError("tuner alerts export", "--label", f"expected KEY=VALUE, got {item!r}")
        labels[key] = value
    rules, text = alerts_app.export(
        optional_session(args), args.files, fmt=args.format, name=args.name, namespace=args.namespace, labels=labels
    )
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        print(f"wrote {len(rules.rules)} rules to {args.output}", file=sys.stderr)
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    paths = [
        str(p)
        for a in args.scenarios
        for p in (sorted(Path(a).glob("*.yaml")) if Path(a).is_dir() else [Path(a)])
        if not str(p).endswith(".rules.yaml")
    ]
    if not paths:
        raise ConfigError("tuner alerts test", "SCENARIO", "no scenario files found")
    promtool = None if args.no_promtool else (args.promtool or shutil.which("promtool"))
    if not args.no_promtool and not promtool:
        raise ConfigError(
            "tuner alerts test",
            "--promtool",
            "promtool not found; install it "
            "(scripts/install-prometheus.sh) or pass --no-promtool to run tuner's side only",
        )
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tuner-alerts-test-"))
    results = alerts_app.run_scenarios(paths, promtool=promtool, workdir=workdir)
    failed = 0
    for path, failures in results.items():
        print(f"{'FAIL' if failures else 'ok  '} {path}")
        for f in failures:
            print("     " + f.replace("\n", "\n     "))
        failed += bool(failures)
    engines = "tuner and promtool" if promtool else "tuner only"
    print(f"{len(results) - failed} passed, {failed} failed ({engines})")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


def cmd_signals(args: argparse.Namespace) -> int:
    rows = [["SIGNAL", "SCOPE", "UNIT", "BACKENDS", "MEANING"]]
    for s in sorted(SIGNALS.values(), key=lambda s: (s.scope, s.name)):
        rows.append([s.name, s.scope, s.unit, ",".join(s.promql), s.help])
    print(table(rows))
    return 0


def add_parsers(sub: Any) -> None:
    a = sub.add_parser(
        "alerts", help="alert rules: current alerts, history, check, export for Prometheus, scenario tests"
    )
    asub = a.add_subparsers(dest="alerts_command", required=True, metavar="ALERTS_COMMAND")

    p = asub.add_parser("list", help="current pending and firing alerts")
    p.add_argument("--all", action="store_true", help="also resolved alerts still kept for re-sending")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)
    p = asub.add_parser("history", help="alert state changes, newest first")
    p.add_argument("--limit", type=COUNT, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_history)
    for name, fn, helptext in (
        ("check", cmd_check, "validate rule files (the config's, or --files)"),
        ("export", cmd_export, "write the rules as a Prometheus rule file"),
    ):
        p = asub.add_parser(name, help=helptext)
        p.add_argument("--files", nargs="+", help="rule files (default: alerting.rule_files, else the default pack)")
        if name == "export":
            p.add_argument(
                "--format",
                choices=["prometheus", "prometheus-operator"],
                default="prometheus",
                help="a Prometheus rule file, or a PrometheusRule object for the Prometheus Operator",
            )
            p.add_argument("--name", default="tuner", help="prometheus-operator: the PrometheusRule's name")
            p.add_argument("--namespace", help="prometheus-operator: its namespace (default: kubectl's)")
            p.add_argument(
                "--label",
                action="append",
                metavar="KEY=VALUE",
                help="prometheus-operator: a label of the object, as the Prometheus resource's "
                "ruleSelector matches it (e.g. release=prometheus); repeatable",
            )
            p.add_argument("-o", "--output", help="file to write (default: stdout)")
        p.set_defaults(func=fn)
    p = asub.add_parser("test", help="run alert scenarios in tuner and in promtool; both must pass")
    p.add_argument("scenarios", nargs="+", help="scenario files or folders (e.g. tests/rules/scenarios)")
    p.add_argument("--promtool", help="promtool binary (default: from PATH)")
    p.add_argument("--no-promtool", action="store_true", help="run tuner's side only")
    p.add_argument("--keep", help="keep the generated promtool files in this folder")
    p.set_defaults(func=cmd_test)
    p = asub.add_parser("signals", help="the signals a rule can test")
    p.set_defaults(func=cmd_signals)
