"""The benchmark: parser, storage, tuner vs Prometheus at each target count, alert latency on a real vLLM (and
whether issue 15's goals 1-3 were met in this run), the fleet path; writes bench/results/YYYY-MM-DD-HHMM-whole-run.md
and refreshes the summary in bench/README.md.

Run it through ``bash bench/run.sh`` (which also cleans up on Ctrl-C); see bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

from bench import alert_latency, summary  # noqa: E402
from bench.micro import bench_parser, bench_scrape_loop, bench_storage  # noqa: E402
from bench.scale import PROMETHEUS, Procs, loadavg, run_one  # noqa: E402
from tuner.config import parse_duration  # noqa: E402

FIXTURE = ROOT / "tests/fixtures/vllm-0.32-cpu/metrics_kv_pressure.txt"
CORE_BUDGET, RSS_BUDGET, P99_BUDGET_MS = 0.25, 250 * 10**6, 20.0  # issue 15's goal 2 at 1,000 targets (250 MB)


def _machine() -> list[str]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "?",
    )
    mem = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:")
    )
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.strip()
    prom = subprocess.run([PROMETHEUS, "--version"], capture_output=True, text=True)
    prom_v = (prom.stdout or prom.stderr).splitlines()[0] if (prom.stdout or prom.stderr) else "?"
    return [
        f"- machine: {os.cpu_count()} CPUs ({cpu}), {mem / 2**20:.1f} GiB RAM, {platform.platform()}",
        f"- versions: Python {platform.python_version()}, tuner {rev}{' + uncommitted changes' if dirty else ''}"
        f", {prom_v}",
    ]


def _mib(b: float) -> str:
    return f"{b / 2**20:.0f} MiB"


def _s(x: float | None, unit: str = "s") -> str:
    return "n/a" if x is None or x != x else f"{x:.3f} {unit}"


def _scale_table(runs: list[dict]) -> list[str]:
    out = [
        "| targets | process | CPU s | CPU % of a core | CPU µs per target-scrape | peak RSS | "
        "scrapes done / scheduled | lag p50 / p99 (interval − nominal) | scrape duration p99 | "
        "samples stored |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        el = r["elapsed_s"]
        for name in ("tuner", "prometheus"):
            d = r[name]
            shown = (
                name
                if r.get("signals", True) or name != "tuner"
                else "tuner, ingest only: signals and rules off (diagnostic)"
            )
            cpu = r["cpu_s"][name]
            per = cpu / d["scrapes_ok"] * 1e6 if d["scrapes_ok"] else float("nan")
            stored = (
                f"{d['rows']:,} rows ({d['values']:,} values)" if name == "tuner" else f"{d['samples']:,.0f} samples"
            )
            out.append(
                f"| {r['targets']} | {shown} | {cpu:.1f} | {cpu / el * 100:.0f}% | {per:,.0f} | "
                f"{_mib(r['peak_rss'][name])} | {d['scrapes_ok']:,.0f} / {r['scheduled']:,.0f} | "
                f"{_s(d['lag_p50_s'])} / {_s(d['lag_p99_s'])} | {_s(d['duration_p99_s'])} | {stored} |"
            )
        out.append(
            f"| {r['targets']} | farm (excluded) | {r['cpu_s']['farm']:.1f} | "
            f"{r['cpu_s']['farm'] / el * 100:.0f}% | | {_mib(r['peak_rss']['farm'])} | | | | |"
        )
    late = [
        f"{r['targets']} targets{'' if r.get('signals', True) else ' (ingest only)'}: p50 {_s(r['tuner']['late_p50_s'])}, p99 {_s(r['tuner']['late_p99_s'])}"
        for r in runs
    ]
    out += ["", "tuner's scrapes, late against each target's own schedule: " + "; ".join(late) + "."]
    return out


def _ratios(runs: list[dict]) -> list[str]:
    out = [
        "| targets | CPU per target-scrape tuner/Prometheus | peak RSS tuner/Prometheus | "
        "tuner CPU vs 25% of a core | tuner RSS vs 250 MB (238 MiB) | load avg start → end |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        if not r.get("signals", True):
            continue
        t, p = r["tuner"], r["prometheus"]
        per_t = r["cpu_s"]["tuner"] / t["scrapes_ok"] if t["scrapes_ok"] else float("nan")
        per_p = r["cpu_s"]["prometheus"] / p["scrapes_ok"] if p["scrapes_ok"] else float("nan")
        core = r["cpu_s"]["tuner"] / r["elapsed_s"]
        out.append(
            f"| {r['targets']} | {per_t / per_p:.2f}× | "
            f"{r['peak_rss']['tuner'] / r['peak_rss']['prometheus']:.2f}× | "
            f"{core * 100:.0f}% ({core / CORE_BUDGET:.2f}× budget) | "
            f"{_mib(r['peak_rss']['tuner'])} ({r['peak_rss']['tuner'] / RSS_BUDGET:.2f}× budget) | "
            f"{r['load_start']} → {r['load_end']} |"
        )
    return out


def _goals(runs: list[dict], alerts: dict | None) -> list[str]:
    """Issue 15's goals 1-3, each met or not, from this run's largest target count and its alert trials."""
    out = ["### Issue 15, goals 1-3 in this run", "", "| goal | measured | met? |", "|---|---|---|"]
    full = [r for r in runs if r.get("signals", True)]
    if full:
        r = max(full, key=lambda r: r["targets"])
        t, p = r["tuner"], r["prometheus"]
        ratio = (r["cpu_s"]["tuner"] / t["scrapes_ok"]) / (r["cpu_s"]["prometheus"] / p["scrapes_ok"])
        core, rss = r["cpu_s"]["tuner"] / r["elapsed_s"], r["peak_rss"]["tuner"]
        # every scheduled scrape (or as many as Prometheus did in the same window: its edges can cut a round)
        every = t["scrapes_ok"] >= min(int(r["scheduled"]), p["scrapes_ok"]) and not t["scrapes_failed"]
        lag = t["lag_p99_s"]
        out += [
            f"| 1. CPU per target-scrape ≤ Prometheus's ({r['targets']} targets, rules on both sides) | "
            f"{ratio:.2f}× | {'yes' if ratio <= 1.0 else 'no'} |",
            f"| 2. {r['targets']} targets: every scheduled scrape, lag p99 < 1 s, ≤ 25% of a core, "
            f"RSS ≤ 250 MB | {t['scrapes_ok']:,} / {r['scheduled']:,.0f} (Prometheus {p['scrapes_ok']:,}), "
            f"lag p99 {lag:.3f} s, {core * 100:.0f}%, {_mib(rss)} | "
            f"{'yes' if every and lag < 1.0 and core <= CORE_BUDGET and rss <= RSS_BUDGET else 'no'} |",
        ]
    if alerts is not None:
        ok, how = alert_latency.verdict(alerts)
        out.append(
            f"| 3. alert latency median ≤ Prometheus + Alertmanager's, no trial > 2× | {how} | "
            f"{'yes' if ok else 'no'} |"
        )
    return out + [""]


def _real_servers() -> None:
    """The vLLM the alert trials start: scripts/setup-real-servers.sh's exports, unless they are set already."""
    if os.environ.get("TUNER_VLLM_PYTHON") and os.environ.get("TUNER_TINY_MODEL"):
        return
    out = subprocess.run(
        ["bash", str(ROOT / "scripts/setup-real-servers.sh")], check=True, capture_output=True, text=True
    ).stdout
    for line in out.splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export ") :].split("=", 1)
            os.environ[key] = shlex.split(value)[0] if value else ""


def _fleet_table(runs: list[dict]) -> list[str]:
    out = [
        "| targets | tuner CPU % of a core | tuner CPU µs per target-read | reads done / scheduled | "
        "lag p99 | tuner RSS | Prometheus CPU % (its scrapes + tuner's queries) | "
        "in process, the fleet in one call: µs per target tuner / Prometheus / wall | "
        "one target per call (2 queries each): µs per target tuner / Prometheus / wall |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in runs:
        t, el, rd = r["tuner"], r["elapsed_s"], r["reads"]
        cpu = r["cpu_s"]["tuner"]
        per = cpu / t["scrapes_ok"] * 1e6 if t["scrapes_ok"] else float("nan")
        out.append(
            f"| {r['targets']} | {cpu / el * 100:.0f}% | {per:,.0f} | {t['scrapes_ok']:,.0f} / "
            f"{r['scheduled']:,.0f} | {_s(t['lag_p99_s'])} | {_mib(r['peak_rss']['tuner'])} | "
            f"{r['cpu_s']['prometheus'] / el * 100:.0f}% | "
            f"{rd.get('fleet_us', 0):,.0f} / {rd.get('fleet_prometheus_us', 0):,.0f} / "
            f"{rd.get('fleet_wall_us', 0):,.0f} | {rd.get('alone_us', 0):,.0f} / "
            f"{rd.get('alone_prometheus_us', 0):,.0f} / {rd.get('alone_wall_us', 0):,.0f} |"
        )
    return out


def _fleet_report(runs: list[dict], interval: float, duration: float) -> list[str]:
    return [
        f"### The fleet path: tuner reads every target from Prometheus, every {interval:g} s, {duration:g} s measured",
        "",
        "Prometheus scrapes the farm's endpoints; `tuner run` has every target with `source: prometheus` and "
        "reads them all in one query of `up` and one of the vLLM series per tick (collect/promsource."
        "scrape_fleet), then stores, derives signals and evaluates rules as for direct targets. After the "
        "run, with tuner stopped, this process times both ways of reading the same Prometheus: the whole "
        "fleet in one call (3 rounds), and 50 targets one call each (the per-target job tuner had before: "
        "two queries per target per tick).",
        "",
        *_fleet_table(runs),
        "",
        *(f"- {r['targets']} targets: load average {r['load_start']} → {r['load_end']}" for r in runs),
        "",
    ]


def _scale_report(runs: list[dict], interval: float, duration: float) -> list[str]:
    warmup = (runs[0].get("warmup_s") if runs else None) or 1.5 * interval
    filled = (
        "the rules read full 5-minute windows; the ingest-only run after the same warm-up, so that its store is "
        "as full: a store's write costs more as it fills, bench/store_growth.py"
        if warmup >= 300
        else "the rules' windows start with only that much history: a daemon that has run 5 minutes costs more; "
        "see --warmup"
    )
    out = [
        f"### tuner vs Prometheus: same endpoints, every {interval:g} s, {duration:g} s measured",
        "",
        "Both scrape every endpoint at the same time (one farm process serves all "
        "endpoints; its CPU is shown and excluded). tuner scrapes /metrics and /health, "
        "parses, keeps the catalogue's series, stores them, and evaluates its default alert rules "
        "(every 15 s, each target's signals over up to 5 minutes of history); Prometheus stores every "
        "sample and evaluates the same rules (`tuner alerts export`, every 15 s; in the ingest-only run "
        f"neither evaluates rules). Measured from {warmup:g} s after both started ({filled}). "
        "Lag: how much later than "
        "the nominal interval consecutive scrapes of a target ran (tuner: its scrapes table; "
        "Prometheus: prometheus_target_interval_length_seconds). tuner's values count each "
        "histogram bucket, _sum and _count as Prometheus does.",
        "",
        *_scale_table(runs),
        "",
        "Ratios and targets (issue 15, goals 1 and 2):",
        "",
        *_ratios(runs),
        "",
    ]
    for r in runs:
        if r["profile"]:
            out += [
                f"Where tuner's time goes at {r['targets']} targets (py-spy --gil, 50 Hz, "
                "--nonblocking: share of the samples in which a tuner thread held the GIL, i.e. of "
                "its Python CPU; SQLite work done with the GIL released is not in it):",
                "",
                "| stage | share |",
                "|---|---:|",
                *(f"| {k} | {v * 100:.0f}% |" for k, v in r["profile"]),
                "",
            ]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", default="100,500,1000", help="comma-separated target counts")
    ap.add_argument("--interval", default="5s")
    ap.add_argument("--duration", default="60s", help="measured time per target count")
    ap.add_argument(
        "--warmup",
        default="6m",
        help="how long tuner and Prometheus run before the measured time (default 6m: the default "
        "alert rules' 5-minute windows full, as in a daemon that has run a while; 0: from the "
        "second interval on). The ingest-only diagnostic run warms up as long: a fuller store costs more "
        "to write to, and the split between ingest and rules is only fair at the same age.",
    )
    ap.add_argument("--storage-days", type=int, default=30, help="days of history for the storage bench (0: skip)")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: parser,storage,scale,alerts,fleet")
    ap.add_argument(
        "--alert-trials",
        type=int,
        default=10,
        help="trials of the alert-latency part (a real vLLM; issue 15's goal 3 asks for at least 10)",
    )
    ap.add_argument(
        "--no-profile", action="store_true", help="do not run py-spy on tuner during the largest target count"
    )
    ap.add_argument(
        "--no-diagnose",
        action="store_true",
        help="skip the extra run at the largest count with tuner's signals job switched off",
    )
    ap.add_argument(
        "--fleet",
        default=None,
        help="target counts for the fleet path, tuner reading every target from Prometheus "
        "(default: the largest of --targets; '' to skip)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory (configs, logs, databases)")
    ap.add_argument("--pidfile", type=Path, help="written with the pids of started processes (run.sh kills them)")
    ap.add_argument(
        "--results",
        type=Path,
        default=None,
        help="the results file (default: bench/results/YYYY-MM-DD-HHMM-whole-run.md, this run's start in UTC; "
        "appended to if it exists)",
    )
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run.sh's trap: clean up like on Ctrl-C
    skip = set(filter(None, args.skip.split(",")))
    interval = parse_duration(args.interval).total_seconds()
    duration = parse_duration(args.duration).total_seconds()
    warmup = parse_duration(args.warmup).total_seconds() if args.warmup not in ("", "0") else None
    counts = [int(x) for x in args.targets.split(",") if x.strip()]
    fleet = (
        [int(x) for x in args.fleet.split(",") if x.strip()]
        if args.fleet is not None
        else [max(counts)]
        if counts
        else []
    )
    command = os.environ.get("BENCH_COMMAND") or shlex.join([sys.executable, *sys.argv])

    work = Path(tempfile.mkdtemp(prefix="tuner-bench-"))
    procs = Procs(pidfile=args.pidfile)
    started = datetime.now(timezone.utc)
    results_file = args.results or summary.results_path("whole-run", started)
    report = [
        f"## {started:%Y-%m-%d %H:%M} UTC",
        "",
        f"Command: `{command}`",
        "",
        *_machine(),
        f"- load average at start: {loadavg()} (other engineers may be running tests on "
        "this machine at the same time; see each run's start/end load below)",
        "",
    ]
    try:
        if "parser" not in skip:
            p = bench_parser(FIXTURE)
            print(
                f"parser: reference {p['reference_us']:.0f} µs, fast path {p['fast_us']:.0f} µs ({p['ratio']:.1f}×)",
                flush=True,
            )
            report += [
                "### Parser: one vLLM exposition",
                "",
                f"`{FIXTURE.relative_to(ROOT)}`: {p['bytes']:,} bytes, {p['samples']} samples; "
                "median of 5 rounds × 200 parses.",
                "",
                "| path | µs per parse |",
                "|---|---:|",
                f"| prometheus_client `text_string_to_metric_families` (all samples) | {p['reference_us']:,.0f} |",
                f"| tuner `fast_samples` (the same samples) | {p['fast_us']:,.0f} |",
                f"| **ratio** | **{p['ratio']:.1f}×** |",
                f"| tuner `parse_exposition` (+ duplicate check, catalogue) | {p['parse_exposition_us']:,.0f} |",
                f"| tuner `vllm.snapshot_from_text` (+ engine assembly) | {p['snapshot_us']:,.0f} |",
                f"| tuner `vllm.snapshot_from_text` by the learned layout (the same shape, counters "
                f"advanced: every scrape after a target's first) | {p['layout_us']:,.0f} |",
                "",
            ]
            loop = bench_scrape_loop(FIXTURE, workdir=work)
            report += [
                "One scrape + store in a single thread against one farm endpoint, the daemon's way (median µs "
                "of 300; the floor of tuner's per-scrape cost, with no other thread contending; the GETs "
                "are wall time and include the farm's answer):",
                "",
                "| " + " | ".join(loop) + " |",
                "|" + "---:|" * len(loop),
                "| " + " | ".join(f"{v:,.0f}" for v in loop.values()) + " |",
                "",
            ]
            print("scrape loop: " + ", ".join(f"{k} {v:.0f} µs" for k, v in loop.items()), flush=True)
        if "storage" not in skip and args.storage_days > 0:
            print(f"storage: writing {args.storage_days} days of one target's history …", flush=True)
            s = bench_storage(FIXTURE, days=args.storage_days, interval_s=interval, workdir=work)
            per_day = s["bytes_per_target_day"]
            report += [
                "### Storage and query: one target",
                "",
                f"{s['days']} days of history written with Store.ingest ({s['ingests']:,} snapshots "
                f"from the fixture, {s['ingest_s'] / s['ingests'] * 1e6:.0f} µs each), thinned by apply_retention "
                f"once per simulated day (default: raw 2d, rollups 30d at 5m; {s['retention_s']:.0f} s "
                "in all). "
                f"The last {s['raw_days']:g} days are "
                f"ingested every {interval:g} s; older days every 60 s (several points per 5-minute "
                "step, so rollups see real min/max/mean), which retention thins to the same rows "
                "5 s history leaves. File size after checkpoint + VACUUM.",
                "",
                f"- database: {_mib(s['db_bytes'])} for {s['days']} days → **{per_day / 2**20:.2f} MiB "
                f"per target-day** averaged over the retention period "
                f"(rows: {', '.join(f'{k} {v:,}' for k, v in s['rows'].items())})",
                f"- of which a raw day ({interval:g} s points) ≈ {s['bytes_per_raw_day'] / 2**20:.2f} MiB and a "
                f"rolled-up day ≈ {s['bytes_per_rolled_day'] / 2**20:.3f} MiB (rows of each kind × that table's "
                "bytes per row from SQLite's dbstat: "
                + ", ".join(f"{k} {v:.0f} B" for k, v in s["bytes_per_row"].items())
                + ")",
                f"- so 1,000 targets at steady state ≈ {per_day * s['days'] * 1000 / 2**30:.1f} GiB, "
                f"10 targets for a month ≈ {per_day * 300 / 1e9:.2f} GB",
                "",
                "Queries read the series the signals use (SIGNAL_METRICS), as `tuner signals` and "
                "`tuner status` do; a window longer than the raw span reads the points retention marked "
                "(Store.window).",
                "",
                "| query (one target, 30 days stored) | ms (window + derive) | of which Store.window | E2E P99 |",
                "|---|---:|---:|---:|",
            ]
            for label, q in s["queries"].items():
                report.append(f"| {label} | {q['ms']:.1f} | {q['window_ms']:.1f} | {_s(q['e2e_p99_s'])} |")
            report.append("")
            print(
                f"storage: {per_day / 2**20:.2f} MiB per target-day; queries "
                + ", ".join(f"{k}: {v['ms']:.1f} ms" for k, v in s["queries"].items()),
                flush=True,
            )
        runs: list[dict] = []
        if "scale" not in skip:
            try:
                for n in counts:
                    print(f"scale: {n} targets every {interval:g}s for {duration:g}s …", flush=True)
                    r = run_one(
                        n,
                        interval,
                        duration,
                        FIXTURE,
                        work / f"n{n}",
                        procs,
                        profile=not args.no_profile and n == max(counts),
                        warmup_s=warmup,
                    )
                    runs.append(r)
                    print("\n".join(_scale_table([r])[2:]), flush=True)
                if counts and not args.no_diagnose:
                    n = max(counts)
                    print(
                        f"scale: {n} targets again, tuner's signals and rules off (diagnostic: ingest only) …",
                        flush=True,
                    )
                    r = run_one(
                        n, interval, duration, FIXTURE, work / f"n{n}-nosignals", procs, signals=False, warmup_s=warmup
                    )
                    runs.append(r)
                    print("\n".join(_scale_table([r])[2:]), flush=True)
            finally:  # the target counts measured so far are reported even when a later one fails
                if runs:
                    report += _scale_report(runs, interval, duration)
                    print("\n".join(_ratios(runs)), flush=True)
        alerts: dict | None = None
        if "alerts" not in skip:
            print(f"alerts: {args.alert_trials} trials of condition onset -> webhook on a real vLLM …", flush=True)
            _real_servers()
            alerts = alert_latency.measure(args.alert_trials)
            lines = alert_latency.report_lines(alerts, command)  # "", "## Alert latency …", …
            report += ["### " + lines[1].lstrip("# "), *lines[2:], ""]
            print("\n".join(lines[-8:]), flush=True)
        if runs or alerts is not None:
            report += _goals(runs, alerts)
            print("\n".join(_goals(runs, alerts)), flush=True)
        fleets: list[dict] = []
        if "fleet" not in skip:
            try:
                for n in fleet:
                    print(
                        f"fleet: {n} targets read from Prometheus every {interval:g}s for {duration:g}s …", flush=True
                    )
                    fleets.append(
                        run_one(
                            n,
                            interval,
                            duration,
                            FIXTURE,
                            work / f"fleet{n}",
                            procs,
                            source="prometheus",
                            warmup_s=warmup,
                        )
                    )
                    print("\n".join(_fleet_table(fleets[-1:])), flush=True)
            finally:
                if fleets:
                    report += _fleet_report(fleets, interval, duration)
        report.append(f"- load average at end: {loadavg()}")
    except Exception as exc:  # keep what was measured, and say why the rest is missing
        report += [
            "",
            f"**Run failed**: {type(exc).__name__}: {exc} (load average {loadavg()}); the parts above "
            "are complete, the rest was not measured.",
            "",
        ]
        raise
    finally:
        procs.stop_all()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory kept: {work}")
        results_file.parent.mkdir(parents=True, exist_ok=True)
        with open(results_file, "a", encoding="utf-8") as f:
            f.write("\n".join(report) + "\n\n")
        print(f"written to {results_file}")
        if args.results is None:
            summary.update_readme()
            print(f"summary refreshed: {summary.README}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
