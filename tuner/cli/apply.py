"""``tuner apply-recommendation``, ``rollback``, ``journal``, ``judge``, ``managed``, ``reconcile`` (use cases:
tuner/app/apply.py and tuner/app/judge.py)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.app import apply as apply_app
from tuner.app.judge import judge_dirs, judge_target
from tuner.apply.verdict import slo_line
from tuner.cli.common import COUNT, RECORD_ID, confirm, duration, float_in, int_in, session, when
from tuner.cli.progress import Heartbeat
from tuner.config import Slo
from tuner.errors import ConfigError
from tuner.files import MAX_FILE_BYTES
from tuner.flags import redact_argv
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store.journal import ApplyOutcome

__all__ = ["add_parsers"]


def _print_apply(a: jr.StoredApply, *, steps: bool = True) -> None:
    diff = ", ".join(f"{k}: {a.old_flags.get(k, '(default)')} -> {v}" for k, v in a.diff.items())
    rec = f" rec #{a.recommendation_id}" if a.recommendation_id is not None else ""
    print(f"apply #{a.id} {a.target} {a.kind}{rec} ({a.mode}) {when(a.created_ms)}  {diff}")
    if (line := slo_line(a.baseline, a.after)) is not None:
        print(f"    {line}")  # the SLO first
    print(f"    state {a.state}" + (f", outcome {a.outcome}" if a.outcome else "") + (f": {a.note}" if a.note else ""))
    if a.kind == "canary" and a.baseline and a.after:  # control and canary over the same window, side by side
        control, canary = a.baseline.get("replica", "control"), a.after.get("replica", "canary")
        keys = [k for k in a.after if k not in ("replica", "window")]
        width = max(len(k) for k in keys) if keys else 10
        print(f"    {'same window':<{width}}  {'control ' + str(control):>24}  {'canary ' + str(canary):>24}")
        for key in keys:
            print(f"    {key:<{width}}  {_fmt(a.baseline.get(key)):>24}  {_fmt(a.after.get(key)):>24}")
    else:
        for label, k in (("before", a.baseline), ("after", a.after)):
            if k:
                print(f"    {label}: " + ", ".join(f"{n}={_fmt(v)}" for n, v in k.items() if n not in _SLO_KEYS))
    if (cost := _cost_line(a)) is not None:
        print(f"    cost: {cost}")
    if steps:
        for s in a.steps:
            detail = s["detail"] if len(s["detail"]) < 200 else s["detail"][:200] + "…"
            print(f"      {when(s['ts_ms'])} {s['step']}" + (f": {detail}" if detail else ""))


_SLO_KEYS = ("slo_objective", "slo_budgets")  # said by the SLO line


def _cost_line(a: jr.StoredApply) -> str | None:
    """What the apply cost the clients, in words, from what the journal holds (see tuner/apply/observe.py:cost)."""
    outage = a.after.get("outage_s")
    if outage is None:
        return None
    parts = [f"served nothing for {outage:g}s (drain, restart, health gate)"]
    held, mean = a.baseline.get("in_flight_at_drain"), a.baseline.get("mean_in_flight")
    if held is not None or mean is not None:
        said = [f"{held} read from its gauges when the drain began"] if held is not None else []
        if mean is not None:  # the gauges are sampled and a loaded vLLM CPU can report 0 while busy
            said.append(
                f"{mean:.1f} on average over the baseline (Little's law: the E2E histogram's seconds / the window)"
            )
        parts.append(
            "request(s) in flight: " + ", ".join(said) + " (the 'stopped' step says how the old server exited)"
        )
    arrivals, offered = a.after.get("arrivals_during_outage"), a.baseline.get("offered_rps")
    if arrivals is not None and offered:
        parts.append(
            f"about {arrivals:g} request(s) arrived meanwhile at {offered:.3g} req/s: refused, or sent "
            "again by clients that retry (only the clients or a load balancer in front can tell which)"
        )
    return "; ".join(parts)


def _fmt(v: Any) -> str:
    if isinstance(v, list):  # e.g. a group's replicas
        return "/".join(_fmt(x) for x in v)
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def _say(quiet: bool) -> Callable[[str], None]:
    return (lambda _m: None) if quiet else (lambda m: print(m, flush=True))


def _waiting(s: Any, target: str) -> Callable[[], str | None]:
    return lambda: apply_app.waiting_on(s, target, time.time())


def cmd_apply(args: argparse.Namespace) -> int:
    s = session(args)
    hb = Heartbeat()  # says what the apply waits for (drain, start, health gate, observation) when quiet
    say = _say(True) if args.json else hb.say
    if args.applied or args.cancel:
        hb.what = None if args.json else _waiting(s, recs.get_recommendation(s.store.engine, args.id).target)
        with hb:
            a = apply_app.applied_by_hand(s, args.id, cancel=args.cancel, say=say)
    else:
        pending = apply_app.plan(s, args.id, say=say)
        plan = pending.plan
        if args.dry_run:
            if args.json:
                print(
                    json.dumps(
                        {
                            "dry_run": True,
                            "target": plan.target.name,
                            "how": plan.how,
                            "diff": plan.diff,
                            "old_flags": plan.old_flags,
                            "new_flags": plan.new_flags,
                            "old_argv": redact_argv(plan.old_argv),
                            "new_argv": redact_argv(plan.new_argv),
                        }
                    )
                )
            else:
                print("dry run: nothing is changed")
                print(pending.describe())
            return 0
        if not args.json:
            print(pending.describe())
        outage = pending.expected_outage()
        cost = (
            f"; {plan.target.name} will serve nothing for about {outage[0]:.0f}s (median of {outage[1]} earlier "
            "applies: drain, restart, health gate)"
            if outage
            else f"; {plan.target.name} serves nothing while it drains and restarts"
            if plan.route.outage
            else f"; {plan.target.name} first as a canary against its peers, then the rest of {plan.target.group} if "
            "it is kept"
            if args.canary
            else f"; rolling over {plan.target.group}'s replicas, the others serving"
            if plan.whole_group
            else ""
        )
        if args.yes and not args.json:  # without --yes the question below says it
            print(f"apply recommendation #{args.id} to {plan.target.name}{cost}", flush=True)
        confirm(args, f"apply recommendation #{args.id} to {plan.target.name}{cost}")
        hb.what = None if args.json else _waiting(s, plan.target.name)
        with hb:
            a = pending.go(force=args.force, canary=args.canary)
    shown = apply_app.shown(s.cfg, a)
    if args.json:
        print(json.dumps(shown.as_json()))
    else:
        _print_apply(shown)
    return 0 if apply_app.held(s, a) else 8


def cmd_rollback(args: argparse.Namespace) -> int:
    s = session(args)
    confirm(args, f"roll {args.target} back to the flags before its last kept apply")
    with Heartbeat(_waiting(s, args.target)) as hb:
        a = apply_app.rollback(s, args.target, force=args.force, say=hb.say)
    _print_apply(apply_app.shown(s.cfg, a))
    return 0 if a.outcome == ApplyOutcome.ROLLED_BACK else 8


def cmd_judge(args: argparse.Namespace) -> int:
    """With directories no config is needed; with TARGET, its store's ranges."""
    if args.before is None or args.after is None:
        raise ConfigError(
            "command line",
            "--before/--after",
            "both are needed: two directories of expositions, or with TARGET two time ranges START..END",
        )
    if args.target:
        v = judge_target(session(args), args.target, args.before, args.after, now=time.time())
    else:
        if args.backend is None:
            raise ConfigError("command line", "--backend", "needed with directories: vllm or llamacpp")
        slo = None
        if args.slo_ttft_p99 or args.slo_e2e_p99:
            slo = Slo(ttft_p99=args.slo_ttft_p99, e2e_p99=args.slo_e2e_p99, objective=args.objective)
        v = judge_dirs(
            Path(args.before),
            Path(args.after),
            backend=args.backend,
            slo=slo,
            min_requests=args.min_requests,
            max_bytes=args.max_bytes,
        )
    if args.json:
        print(json.dumps(v.as_json()))
        return 0
    line = v.slo.line() if v.slo else slo_line(v.before, v.after)
    if line:
        print(line)  # the SLO first: the objective, each window's attainment with its interval
    print(f"{v.outcome} (confidence {v.confidence:.2f}): {v.reason}")
    print(f"test: {v.test}")
    keys = [k for k in jr.KPI_KEYS if k in v.before or k in v.after]
    print(f"{'':24}{'before':>12}{'after':>12}")
    for k in keys:
        print(f"{k:24}{_fmt(v.before.get(k)):>12}{_fmt(v.after.get(k)):>12}")
    return 0


def cmd_journal(args: argparse.Namespace) -> int:
    rows = apply_app.journal(session(args), args.target, limit=args.limit)
    if args.json:
        print(json.dumps([a.as_json() for a in rows]))
        return 0
    if not rows:
        print("no applies yet")
    for a in rows:
        _print_apply(a, steps=not args.brief)
    return 0


def cmd_managed(args: argparse.Namespace) -> int:
    s = session(args)
    targets = apply_app.managed_targets(s, args.target)
    if not targets:
        print("no managed targets in the config (add a managed: section to a target)")
        return 0
    starting: list[str] = []
    hb = Heartbeat(lambda: starting[0] if starting else None)
    ap = s.applier(hb.say)
    rc = 0
    for t in targets:
        if args.action == "start":
            starting[:] = [f"{t.name}: waiting for the server to start and pass the health gate"]
            with hb:
                ap.servers.start(t)
            starting.clear()
        elif args.action == "stop":
            print(f"{t.name}: {ap.servers.stop(t)}")
        else:
            st = jr.get_managed(ap.engine, t.name)
            r = ap.running(t)
            state = "running" if r else (st.state if st else "never started")
            print(
                f"{t.name:16} {state:10} pid {r.pid if r else '-':<8} flags {json.dumps(ap.flags_in_force(t))}"
                + (f"  note: {s.cfg.redact(st.note)}" if st and st.note else "")
            )
            rc = rc or (0 if r else 1)
    return rc


def cmd_reconcile(args: argparse.Namespace) -> int:
    s = session(args)

    def what() -> str | None:  # a reconcile finishes or rolls back applies: say which step it waits on
        return next(
            (w for t in s.cfg.targets if (w := apply_app.waiting_on(s, t.name, time.time()))),
            "reconciling (checking open applies and managed servers)",
        )

    with Heartbeat(what) as hb:
        lines = apply_app.reconcile(s, say=hb.say)
    print(s.cfg.redact("\n".join(lines)) if lines else "nothing to reconcile")
    return 0


def cmd_haproxy_config(args: argparse.Namespace) -> int:
    print(apply_app.haproxy_config_for(session(args).cfg, args.group), end="")
    return 0


def add_parsers(sub: Any) -> None:
    a = sub.add_parser(
        "apply-recommendation",
        help="apply a stored recommendation: drain, restart with the new flags, "
        "health gate, observe, keep or roll back (journaled)",
    )
    a.add_argument("id", type=RECORD_ID)
    a.add_argument("--dry-run", action="store_true", help="print the flag diff and the full argv; change nothing")
    a.add_argument("--yes", action="store_true", help="do not ask for confirmation (needed without a terminal)")
    a.add_argument(
        "--applied",
        action="store_true",
        help="you restarted an unmanaged server by hand as tuner asked: health-check and observe it",
    )
    a.add_argument("--cancel", action="store_true", help="drop an apply that waits for a restart by hand")
    a.add_argument("--force", action="store_true", help="apply even past apply.max_restarts_per_hour")
    a.add_argument(
        "--canary",
        action="store_true",
        help="replica groups: change this replica only, judge it against an unchanged peer over the same "
        "window (same live traffic), then roll out to the group or put it back",
    )
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_apply)

    r = sub.add_parser("rollback", help="restore the flags a target had before its last kept apply")
    r.add_argument("target")
    r.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    r.add_argument("--force", action="store_true", help="roll back even past apply.max_restarts_per_hour")
    r.set_defaults(func=cmd_rollback)

    j = sub.add_parser("journal", help="every apply and rollback, step by step, with the verdict and its numbers")
    j.add_argument("target", nargs="?")
    j.add_argument("--limit", type=COUNT, default=20)
    j.add_argument("--brief", action="store_true", help="without the steps")
    j.add_argument("--json", action="store_true")
    j.set_defaults(func=cmd_journal)

    v = sub.add_parser(
        "judge",
        help="the apply verdict (kept | rolled_back | inconclusive) on recorded data: two "
        "directories of expositions named <unix_ms>.txt, or two time ranges of TARGET's store",
        description="With directories no config is needed: `tuner judge --before DIR --after DIR "
        "--backend vllm --json`. With TARGET: `tuner judge TARGET --before 20m..10m --after 10m..now` "
        "(unix seconds, durations ago, or now).",
    )
    v.add_argument(
        "target",
        nargs="?",
        help="a configured target, or a replica group (its replicas together, as "
        "a rolling apply is judged): --before/--after are then START..END ranges",
    )
    v.add_argument("--before", help="directory (or with TARGET a range START..END) before the change")
    v.add_argument("--after", help="directory (or with TARGET a range START..END) after the change")
    v.add_argument("--backend", choices=["vllm", "llamacpp"], help="the server that wrote the expositions")
    v.add_argument(
        "--slo-ttft-p99", type=duration, help="TTFT budget, e.g. 500ms (directories only; a target has its slo)"
    )
    v.add_argument("--slo-e2e-p99", type=duration, help="end-to-end budget, e.g. 10s")
    v.add_argument(
        "--objective",
        type=float_in(0, 1, low_open=True),
        default=0.99,
        help="share of requests that must meet the budgets",
    )
    v.add_argument(
        "--min-requests",
        type=int_in(0, 2**31),
        default=20,
        help="fewer finished on either side (llama-server: tokens): inconclusive",
    )
    v.add_argument(
        "--json", action="store_true", help="one JSON object: outcome, reason, confidence, test, before, after"
    )
    v.add_argument(
        "--max-bytes",
        type=int_in(1, 2**40),
        default=MAX_FILE_BYTES,
        help="largest exposition read, after decompression (default 10 MiB, as a scrape's body)",
    )
    v.set_defaults(func=cmd_judge)

    m = sub.add_parser("managed", help="servers tuner starts itself (targets with managed:): status, start, stop")
    m.add_argument("action", choices=["status", "start", "stop"])
    m.add_argument("target", nargs="?")
    m.set_defaults(func=cmd_managed)

    h = sub.add_parser(
        "haproxy-config",
        help="print the HAProxy config tuner expects in front of a replica group "
        "or a blue/green target (admin socket, /health checks, retries with redispatch)",
    )
    h.add_argument(
        "group",
        help="the group's name (a target with replicas:), or a target with balancer.server (blue/green on one host)",
    )
    h.set_defaults(func=cmd_haproxy_config)

    c = sub.add_parser("reconcile", help="finish or roll back applies left half done by a tuner that died")
    c.set_defaults(func=cmd_reconcile)
