"""Alert scenarios: series written as text at a fixed step, and the alerts expected at given times.

The format is promtool's unit-test format, so one file runs in two engines: ``run`` evaluates it with
tuner's own signals and state machine; ``to_promtool`` writes the same scenario (with tuner's rules
exported) as a ``promtool test rules`` file. A scenario passes when both agree with it.

    rules: ../../alerts/default.yaml            # relative to the scenario file
    target: {name: chat, backend: vllm, slo: {ttft_p99: 500ms}}
    interval: 15s                              # step of the series (and of evaluation)
    input_series:
      - series: 'vllm:kv_cache_usage_perc{engine="0",model_name="m"}'
        values: '0.5x4 0.97x30 0.2x10'        # promtool's notation: a+bxN, axN, _, _xN, stale
    alert_rule_test:
      - eval_time: 7m
        alertname: KVCacheHigh
        exp_alerts:
          - exp_labels: {severity: critical, engine: "0", model_name: m}

Series of tuner's own exporter stand for what tuner knows of itself: ``tuner_target_up`` and
``tuner_target_server_healthy`` give the target's health (its last scrape, its /health), and the series
signals/selfwatch.py reads (``tuner_scrape_failures_total``, ``tuner_alert_notifications_queued``,
``tuner_applies_last_hour``, ...) give the signals of tuner's own loop, computed as the daemon computes them.

Each step evaluates every group with ``eval_group`` (tuner/rules/group.py), the evaluation the daemon runs, fed:

- the targets' signals from the scraped series (by their ``target`` label, the scenario's target when none);
  the gauges tuner exports where a server has no metric of its own (``tuner_goodput_ratio``,
  ``tuner_kv_cache_usage_ratio``, ``tuner_requests_waiting``, ... the series the exported rules read) stand for
  that signal of their engine, as ``tuner_target_up`` stands for the target's health;
- the GPUs' latest readings from ``tuner_gpu_memory_used_bytes``, ``tuner_gpu_memory_total_bytes`` and
  ``tuner_gpu_processes`` (labels ``gpu``, ``uuid``; the newest sample within Prometheus's 5m lookback);
- replica groups: a target with ``replicas: [r1, r2]`` is expanded as the config expands it (targets ``chat.r1``,
  ``chat.r2`` of group ``chat``; the balancer and URLs need not be given), each replica's series name it in their
  ``target`` label, and a rule ``over: groups`` reads what the replicas served together, as the daemon does;
- tuner's own signals (``self_signal``), as above.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from tuner.collect.catalogue import lookup
from tuner.config import Target, parse_duration, replica_groups
from tuner.errors import InputFileError, RuleFileError
from tuner.files import read_text
from tuner.names import VLLM_NUM_REQUESTS_WAITING
from tuner.rules.evaluate import configured_max_num_seqs
from tuner.rules.export import dump, fmt_duration, prometheus_rules
from tuner.rules.group import Inputs, eval_group
from tuner.rules.model import Rule, RuleSet, load_rule_files
from tuner.rules.signals import ENGINE_BY, SIGNALS
from tuner.rules.state import AlertState
from tuner.signals.derive import EngineSignals, TargetSignals, compute_signals, group_signals
from tuner.signals.selfwatch import LOOKBACK_MS, SeriesByTarget, self_signal
from tuner.store.window import EngineWindow, GpuLatest, HistPoint, HistSeries, Point, TargetHealth, TargetWindow

__all__ = ["Scenario", "load_scenario", "expand_values", "parse_series", "run", "to_promtool"]

_SERIES = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{(.*)\})?\s*\Z")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_NUM = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|Inf|NaN)"
_ITEM = re.compile(rf"^(?:(?P<blank>_)(?:x(?P<bn>\d+))?|(?P<v>{_NUM})(?:(?P<d>[-+]{_NUM[5:]})?x(?P<n>\d+))?|stale)\Z")


def expand_values(text: str) -> list[float | None]:
    """promtool's value notation → one value (or None for a missing sample) per step."""
    out: list[float | None] = []
    for tok in text.split():
        m = _ITEM.match(tok)
        if not m:
            raise ValueError(f"cannot read series value {tok!r} (forms: 1.5, 1+2x10, 3x5, _, _x3, stale)")
        if tok == "stale":
            out.append(None)
        elif m.group("blank"):
            out += [None] * (int(m.group("bn")) if m.group("bn") else 1)
        else:
            v = float(m.group("v"))
            if m.group("n") is None:
                out.append(v)
                continue
            n, step = int(m.group("n")), float(m.group("d") or 0)
            out.append(v)
            for _ in range(n):  # repeated addition, as Prometheus's parser does
                v += step
                out.append(v)
    return out


def parse_series(text: str) -> tuple[str, dict[str, str]]:
    m = _SERIES.match(text)
    if not m:
        raise ValueError(f'cannot read series {text!r}; expected name{{label="value",...}}')
    labels = dict(_LABEL.findall(m.group(2) or ""))
    return m.group(1), labels


@dataclass
class Scenario:
    path: str
    rules: RuleSet
    rule_files: list[str]
    target: Target
    interval: timedelta
    series: list[tuple[str, dict[str, str], list[float | None]]]
    tests: list[dict[str, Any]]
    raw: dict[str, Any] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)  # ``target`` expanded: its replicas when it is a group


# tuner's exported engine gauges that an exported rule reads (``max by (target, engine, model_name) (tuner_X)``),
# by series: the EngineSignals field each one stands for in a scenario
_TUNER_GAUGES = {
    m.group(1): spec.name
    for spec in SIGNALS.values()
    for expr in spec.promql.values()
    if (m := re.fullmatch(rf"max by \({ENGINE_BY}\) \((tuner_\w+)\{{sel\}}\)", expr))
    and spec.name in EngineSignals.__dataclass_fields__
}
_GPU_SERIES = ("tuner_gpu_memory_used_bytes", "tuner_gpu_memory_total_bytes", "tuner_gpu_processes")


def _target(raw: dict[str, Any]) -> Target:
    """The scenario's target as the config reads one; a group's balancer and replica URLs are filled in (a
    scenario has no server to reach)."""
    doc = {"url": "http://127.0.0.1:1", "name": "t", "backend": "vllm", **raw}
    if doc.get("replicas"):
        doc["replicas"] = [
            {"url": f"http://127.0.0.1:{2 + i}", **({"name": r} if isinstance(r, str) else r)}
            for i, r in enumerate(doc["replicas"])
        ]
        doc.setdefault("balancer", {"socket": "/nonexistent/haproxy.sock", "backend": doc["name"]})
    return Target.model_validate(doc)


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        doc = yaml.safe_load(read_text(p))
    except InputFileError as exc:  # missing, not UTF-8, too large
        raise RuleFileError(str(p), None, f"cannot read scenario: {exc.reason}") from None
    except yaml.YAMLError as exc:
        raise RuleFileError(str(p), None, f"cannot read scenario: {exc}") from None
    try:
        files = doc["rules"] if isinstance(doc["rules"], list) else [doc["rules"]]
        files = [str((p.parent / f).resolve()) for f in files]
        target = _target(doc.get("target") or {})
        interval = parse_duration(doc.get("interval", "15s"))
        series = []
        for s in doc["input_series"]:
            name, labels = parse_series(s["series"])
            series.append((name, labels, expand_values(str(s["values"]))))
        tests = list(doc.get("alert_rule_test") or [])
    except (KeyError, TypeError, ValueError) as exc:
        raise RuleFileError(str(p), None, f"invalid scenario: {exc}") from None
    return Scenario(
        str(p), load_rule_files(files, interval), files, target, interval, series, tests, doc, target.members()
    )


def _window(sc: Scenario, target: Target, start_ms: int, end_ms: int) -> TargetWindow:
    """The target's series cut to [start, end], shaped as the store would hand them to signals."""
    step = int(sc.interval.total_seconds() * 1000)
    plain: dict[tuple[str, str], dict] = defaultdict(dict)
    buckets: dict[tuple, dict[float, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for name, labels, values in sc.series:
        hit = lookup(name)
        if hit is None or labels.get("target", sc.target.name) != target.name:
            continue
        spec, part = hit
        eng = (labels.get("engine", "0"), labels.get("model_name", sc.target.name))
        extra = tuple(sorted((k, v) for k, v in labels.items() if k not in ("engine", "model_name", "le", "target")))
        pts = [(i * step, v) for i, v in enumerate(values) if v is not None and start_ms <= i * step <= end_ms]
        if part == "value":
            plain[eng][(spec.name, extra)] = tuple(pts)
        elif part == "bucket":
            le = labels["le"]
            bound = math.inf if le in ("+Inf", "Inf") else float(le)
            buckets[(eng, spec.name, extra)][bound] = dict(pts)
    hists: dict[tuple[str, str], dict] = defaultdict(dict)
    for (eng, metric, extra), by_bound in buckets.items():
        bounds = tuple(sorted(by_bound))
        times = sorted(set.intersection(*(set(v) for v in by_bound.values())))
        hists[eng][(metric, extra)] = HistSeries(
            bounds,
            tuple(HistPoint(t, tuple(by_bound[b][t] for b in bounds), 0.0, by_bound[bounds[-1]][t]) for t in times),
        )
    engines = sorted(set(plain) | set(hists))
    return TargetWindow(
        target=target.name,
        backend=target.backend,
        start_ms=start_ms,
        end_ms=end_ms,
        health=_health(sc, target.name, end_ms),
        engines=tuple(EngineWindow(e[0], e[1], plain.get(e, {}), hists.get(e, {})) for e in engines),
    )


def _own_series(sc: Scenario, metric: str, now_ms: int) -> dict[str, list[Point]]:
    """Points of one of tuner's own series up to ``now_ms``, by their ``target`` label (the scenario's target
    when the series has none, as to_promtool labels it)."""
    step = int(sc.interval.total_seconds() * 1000)
    out: dict[str, list[Point]] = {}
    for name, labels, values in sc.series:
        if name == metric:
            pts = [(i * step, v) for i, v in enumerate(values) if v is not None and i * step <= now_ms]
            out.setdefault(labels.get("target", sc.target.name), []).extend(pts)
    return out


def _latest(pts: list[Point], now_ms: int) -> float | None:
    """A gauge's instant value at ``now_ms``, as Prometheus reads it: its newest sample within the lookback."""
    pts = [p for p in pts if now_ms - LOOKBACK_MS <= p[0] <= now_ms]
    return max(pts)[1] if pts else None


def _health(sc: Scenario, target: str, now_ms: int) -> TargetHealth | None:
    """The target's health from tuner_target_up / tuner_target_server_healthy (their newest sample within the
    lookback); None without either."""

    def latest(metric: str) -> float | None:
        return _latest(_own_series(sc, metric, now_ms).get(target, []), now_ms)

    up, healthy = latest("tuner_target_up"), latest("tuner_target_server_healthy")
    if up is None and healthy is None:
        return None
    return TargetHealth(
        health="down" if up == 0 else "up",
        last_error="",
        last_scrape_ms=now_ms,
        last_success_ms=None,
        last_duration_s=0.0,
        consecutive_failures=0,
        server_healthy=None if healthy is None else bool(healthy),
    )


def _exported_gauges(sc: Scenario, sig: TargetSignals, now_ms: int) -> TargetSignals:
    """``sig`` with the values of tuner's exported engine gauges the scenario gives for this target (see the module's
    docstring): each stands for its signal on its engine, an engine no scraped series names included."""
    step = int(sc.interval.total_seconds() * 1000)
    given: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)  # engine -> EngineSignals field -> value
    for name, labels, values in sc.series:
        if name in _TUNER_GAUGES and labels.get("target", sc.target.name) == sig.target:
            v = _latest([(i * step, x) for i, x in enumerate(values) if x is not None], now_ms)
            if v is not None:
                given[(labels.get("engine", "0"), labels.get("model_name", sc.target.name))][_TUNER_GAUGES[name]] = v
    if not given:
        return sig
    engines = {(e.engine, e.model_name): e for e in sig.engines}
    for (engine, model), fields in given.items():
        e = engines.get((engine, model)) or EngineSignals(engine=engine, model_name=model, samples=0)
        engines[(engine, model)] = replace(e, **fields)
    return replace(sig, engines=tuple(engines.values()))


def _gpus(sc: Scenario, now_ms: int) -> list[GpuLatest]:
    """The GPUs' readings at ``now_ms`` from tuner's exported GPU series, by their ``gpu`` and ``uuid`` labels."""
    step = int(sc.interval.total_seconds() * 1000)
    read: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for name, labels, values in sc.series:
        if name in _GPU_SERIES:
            v = _latest([(i * step, x) for i, x in enumerate(values) if x is not None], now_ms)
            if v is not None:
                read[(labels.get("gpu", "0"), labels.get("uuid", ""))][name] = v
    out = []
    for (gpu, uuid), got in sorted(read.items()):
        used, total = got.get("tuner_gpu_memory_used_bytes"), got.get("tuner_gpu_memory_total_bytes")
        procs = int(got.get("tuner_gpu_processes", 0))
        out.append(
            GpuLatest(
                ts_ms=now_ms,
                index=int(gpu),
                uuid=uuid,
                name="",
                utilization=None,
                memory_used_bytes=None if used is None else int(used),
                memory_total_bytes=None if total is None else int(total),
                temperature_c=None,
                power_w=None,
                processes=tuple((0, "", None) for _ in range(procs)),
            )
        )
    return out


def _inputs(sc: Scenario, ts: int) -> Inputs:
    """What the rules read at ``ts``, from the scenario's series: the daemon's inputs, read from a file."""
    groups = replica_groups(sc.targets)
    by_name = {t.name: t for t in sc.targets}
    cache: dict[tuple[str, timedelta], TargetSignals | None] = {}

    def signals(name: str, window: timedelta) -> TargetSignals | None:
        if (name, window) not in cache:
            lo = ts - int(window.total_seconds() * 1000)
            if name in groups:  # a rule over groups: the replicas' windows together, as group_signals_at does
                members = groups[name]
                sig = group_signals(name, [_window(sc, m, lo, ts) for m in members], slo=members[0].slo)
            else:
                sig = compute_signals(_window(sc, by_name[name], lo, ts), slo=by_name[name].slo)
            cache[(name, window)] = _exported_gauges(sc, sig, ts)
        return cache[(name, window)]

    def own(target: str, signal: str, window: timedelta) -> float | None:
        def points(metric: str) -> SeriesByTarget:
            return _own_series(sc, metric, ts)

        return self_signal(signal, target, window.total_seconds(), ts, points)

    return Inputs(sc.targets, signals, _gpus(sc, ts), target_signal=own, max_num_seqs=configured_max_num_seqs)


def run(sc: Scenario) -> tuple[list[str], dict[int, dict[str, list[dict]]]]:
    """Evaluate the scenario with tuner; returns (failures, firing alerts by eval time and alertname).

    Each firing alert is {labels, annotations, rule}: ``rule`` is its key (group/alert)."""
    step = int(sc.interval.total_seconds() * 1000)
    wanted = {_ms(t["eval_time"]) for t in sc.tests}
    end = max(wanted, default=0)
    state: dict[str, dict] = {}
    firing: dict[int, dict[str, list[dict]]] = {}
    errors: list[str] = []
    for ts in range(0, end + 1, step):
        inputs = _inputs(sc, ts)
        for g in sc.rules.groups:
            out = eval_group(g, state, ts, inputs)
            state.update(out.state)
            errors += [f"{sc.path}: at {ts / 1000:g}s: {e}" for e in out.failed.values()]
        if ts in wanted:
            snap: dict[str, list[dict]] = defaultdict(list)
            for alerts in state.values():
                for a in alerts.values():
                    if a.state == AlertState.FIRING:
                        snap[a.labels["alertname"]].append(
                            {"labels": a.labels, "annotations": a.annotations, "rule": a.rule}
                        )
            firing[ts] = dict(snap)
    failures = errors
    for t in sc.tests:
        ts = _ms(t["eval_time"])
        got = firing.get(ts, {}).get(t["alertname"], [])
        got_labels = sorted((_strip(a["labels"], sc.target.name) for a in got), key=_key)  # dicts do not order
        exp = t.get("exp_alerts") or []
        exp_labels = sorted(({str(k): str(v) for k, v in e.get("exp_labels", {}).items()} for e in exp), key=_key)
        if sorted(map(_key, got_labels)) != sorted(map(_key, exp_labels)):
            failures.append(
                f"{sc.path}: at {t['eval_time']} {t['alertname']}: tuner has {got_labels or 'nothing'} "
                f"firing, expected {exp_labels or 'nothing'}"
            )
            continue
        for e in exp:
            if "exp_annotations" not in e:
                continue
            match = [
                a
                for a in got
                if _strip(a["labels"], sc.target.name) == {str(k): str(v) for k, v in e["exp_labels"].items()}
            ]
            if match and match[0]["annotations"] != e["exp_annotations"]:
                failures.append(
                    f"{sc.path}: at {t['eval_time']} {t['alertname']}: annotations "
                    f"{match[0]['annotations']} != {e['exp_annotations']}"
                )
    return failures, firing


def _ms(eval_time: Any) -> int:
    return 0 if eval_time in (0, "0", "0s") else int(parse_duration(eval_time).total_seconds() * 1000)


def _strip(labels: dict[str, str], target: str) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != "alertname" and not (k == "target" and v == target)}


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def to_promtool(sc: Scenario, firing: dict[int, dict[str, list[dict]]], rules_file: str) -> tuple[str, str]:
    """(rules file text, promtool test file text) for the same scenario.

    Input series get the scenario's ``target`` label; expected annotations are those in the scenario,
    else tuner's own rendering at that time — so promtool also checks that the texts agree.
    """
    rules_text = dump(prometheus_rules(sc.rules, sc.targets))
    series = []
    for name, labels, values in [*sc.series, *_queue_ratio_series(sc)]:
        series.append(
            {
                "series": _exported_series(sc, name, labels),
                "values": " ".join("_" if v is None else repr(v) for v in values),
            }
        )
    rules = {r.alert: r for r in sc.rules.rules}
    tests = []
    for t in sc.tests:
        ts = _ms(t["eval_time"])
        rule = rules.get(t["alertname"])
        got = {
            _key(_strip(a["labels"], sc.target.name)): a["annotations"]
            for a in firing.get(ts, {}).get(t["alertname"], [])
        }
        exp = []
        for e in t.get("exp_alerts") or []:
            lbl = {str(k): str(v) for k, v in e.get("exp_labels", {}).items()}
            ann = e.get("exp_annotations", got.get(_key(lbl), {}))
            exp.append({"exp_labels": _exported_labels(sc, rule, lbl), "exp_annotations": ann})
        tests.append({"eval_time": t["eval_time"], "alertname": t["alertname"], "exp_alerts": exp})
    doc = {
        "rule_files": [rules_file],
        "evaluation_interval": fmt_duration(sc.interval),
        "tests": [{"interval": fmt_duration(sc.interval), "input_series": series, "alert_rule_test": tests}],
    }
    return rules_text, dump(doc)


def _exported_series(sc: Scenario, name: str, labels: dict[str, str]) -> str:
    """A scenario series as a Prometheus scraping the same servers (and tuner) holds it: labelled with its target,
    a replica's series with its ``group`` too (the label the exported rules over groups sum by, which the replicas'
    scrape config gives), and tuner's engine gauges with the target's ``backend``, as tuner's exporter labels them."""
    out = {"target": sc.target.name}  # a series may name another target (tuner's own series)
    target = next((t for t in sc.targets if t.name == labels.get("target", sc.target.name)), None)
    if target is not None and target.group:
        out["group"] = target.group
    if target is not None and (name in _TUNER_GAUGES or name == "tuner_queue_to_max_num_seqs_ratio"):
        out["backend"] = target.backend
    out.update(labels)
    body = ",".join(f'{k}="{v}"' for k, v in sorted(out.items()))
    return f"{name}{{{body}}}"


def _queue_ratio_series(sc: Scenario) -> list[tuple[str, dict[str, str], list[float | None]]]:
    """``tuner_queue_to_max_num_seqs_ratio`` as tuner's exporter serves it, for promtool: each engine's waiting
    requests over the max-num-seqs its target runs with (here, its configured flag), where the scenario gives the
    waiting requests and not the ratio itself."""
    if any(name == "tuner_queue_to_max_num_seqs_ratio" for name, _, _ in sc.series):
        return []
    by_name = {t.name: t for t in sc.targets}
    out = []
    for name, labels, values in sc.series:
        target = by_name.get(labels.get("target", sc.target.name))
        limit = configured_max_num_seqs(target) if target is not None else None
        if name == VLLM_NUM_REQUESTS_WAITING and limit:
            out.append(
                ("tuner_queue_to_max_num_seqs_ratio", labels, [None if v is None else v / limit for v in values])
            )
    return out


def _exported_labels(sc: Scenario, rule: Rule | None, labels: dict[str, str]) -> dict[str, str]:
    """The labels the exported rule gives an alert tuner labels ``labels`` (without its scenario target): the
    target's, except for GPU and tuner rules, which have none. A rule over groups is exported as a sum over the
    replicas by (group, model_name), with no ``engine`` label where tuner names the group's one engine "all"; over
    tuner's own group series (target=GROUP) the target label stays beside ``group``."""
    if rule is not None and rule.scope in ("gpu", "tuner"):
        return dict(labels)
    if rule is None or rule.over != "groups":
        return {**labels, "target": sc.target.name}
    spec = SIGNALS[rule.signal]
    template = spec.promql.get(rule.backend) or spec.promql.get("any") or ""
    out = {k: v for k, v in labels.items() if not (k == "engine" and v == "all")}
    return {**out, "target": labels["group"]} if "tuner_" in template and "group" in labels else out


def check_files(paths: list[str], *, promtool: str | None, workdir: Path) -> dict[str, list[str]]:
    """Run each scenario in tuner and, given promtool, in Prometheus too; failures per scenario file."""
    import subprocess

    results: dict[str, list[str]] = {}
    for i, path in enumerate(paths):
        sc = load_scenario(path)
        failures, firing = run(sc)
        if promtool:
            d = workdir / f"{i:03d}-{Path(path).stem}"
            d.mkdir(parents=True, exist_ok=True)
            rules_text, test_text = to_promtool(sc, firing, "rules.yml")
            (d / "rules.yml").write_text(rules_text)
            (d / "test.yml").write_text(test_text)
            proc = subprocess.run(
                [promtool, "test", "rules", "test.yml"], cwd=d, capture_output=True, text=True, timeout=120
            )
            if proc.returncode != 0:
                failures.append(f"{path}: promtool disagrees (files in {d}):\n{(proc.stdout + proc.stderr).strip()}")
        results[path] = failures
    return results
