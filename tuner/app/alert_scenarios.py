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
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from tuner.collect.catalogue import lookup
from tuner.config import Target, parse_duration
from tuner.errors import InputFileError, RuleFileError
from tuner.files import read_text
from tuner.rules.evaluate import evaluate, vector
from tuner.rules.export import dump, fmt_duration, prometheus_rules
from tuner.rules.model import RuleSet, load_rule_files
from tuner.rules.state import AlertState
from tuner.signals.derive import compute_signals
from tuner.signals.selfwatch import LOOKBACK_MS, SeriesByTarget, self_signal
from tuner.store.window import EngineWindow, HistPoint, HistSeries, Point, TargetHealth, TargetWindow

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
        raise ValueError(f"cannot read series {text!r}; expected name{{label=\"value\",...}}")
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
        target = Target.model_validate({"url": "http://127.0.0.1:1", "name": "t", "backend": "vllm",
                                        **(doc.get("target") or {})})
        interval = parse_duration(doc.get("interval", "15s"))
        series = []
        for s in doc["input_series"]:
            name, labels = parse_series(s["series"])
            series.append((name, labels, expand_values(str(s["values"]))))
        tests = list(doc.get("alert_rule_test") or [])
    except (KeyError, TypeError, ValueError) as exc:
        raise RuleFileError(str(p), None, f"invalid scenario: {exc}") from None
    return Scenario(str(p), load_rule_files(files, interval), files, target, interval, series, tests, doc)


def _window(sc: Scenario, start_ms: int, end_ms: int) -> TargetWindow:
    """The scenario's series cut to [start, end], shaped as the store would hand them to signals."""
    step = int(sc.interval.total_seconds() * 1000)
    plain: dict[tuple[str, str], dict] = defaultdict(dict)
    buckets: dict[tuple, dict[float, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for name, labels, values in sc.series:
        hit = lookup(name)
        if hit is None:
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
        hists[eng][(metric, extra)] = HistSeries(bounds, tuple(
            HistPoint(t, tuple(by_bound[b][t] for b in bounds), 0.0, by_bound[bounds[-1]][t]) for t in times))
    engines = sorted(set(plain) | set(hists))
    return TargetWindow(target=sc.target.name, backend=sc.target.backend, start_ms=start_ms, end_ms=end_ms,
                        health=_health(sc, end_ms), engines=tuple(EngineWindow(e[0], e[1], plain.get(e, {}),
                                                                               hists.get(e, {})) for e in engines))


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


def _health(sc: Scenario, now_ms: int) -> TargetHealth | None:
    """The target's health from tuner_target_up / tuner_target_server_healthy (their newest sample within the
    lookback); None without either."""
    def latest(metric: str) -> float | None:
        pts = [p for p in _own_series(sc, metric, now_ms).get(sc.target.name, []) if now_ms - p[0] <= LOOKBACK_MS]
        return max(pts)[1] if pts else None
    up, healthy = latest("tuner_target_up"), latest("tuner_target_server_healthy")
    if up is None and healthy is None:
        return None
    return TargetHealth(health="down" if up == 0 else "up", last_error="", last_scrape_ms=now_ms,
                        last_success_ms=None, last_duration_s=0.0, consecutive_failures=0,
                        server_healthy=None if healthy is None else bool(healthy))


def run(sc: Scenario) -> tuple[list[str], dict[int, dict[str, list[dict]]]]:
    """Evaluate the scenario with tuner; returns (failures, firing alerts by eval time and alertname)."""
    step = int(sc.interval.total_seconds() * 1000)
    wanted = {_ms(t["eval_time"]) for t in sc.tests}
    end = max(wanted, default=0)
    state: dict[str, dict] = {}
    firing: dict[int, dict[str, list[dict]]] = {}
    for ts in range(0, end + 1, step):
        cache: dict[timedelta, Any] = {}

        def signals(_name: str, window: timedelta, cache: dict[timedelta, Any] = cache, ts: int = ts):
            if window not in cache:
                w = int(window.total_seconds() * 1000)
                cache[window] = compute_signals(_window(sc, ts - w, ts), slo=sc.target.slo)
            return cache[window]

        def own(target: str, signal: str, window: timedelta, now: int = ts) -> float | None:
            def points(metric: str) -> SeriesByTarget:
                return _own_series(sc, metric, now)
            return self_signal(signal, target, window.total_seconds(), now, points)

        for g in sc.rules.groups:
            for rule in g.rules:
                key = g.key(rule)
                state[key], _ = evaluate(rule, vector(rule, [sc.target], signals, target_signal=own),
                                         state.get(key, {}), ts, key=key)
        if ts in wanted:
            snap: dict[str, list[dict]] = defaultdict(list)
            for alerts in state.values():
                for a in alerts.values():
                    if a.state == AlertState.FIRING:
                        snap[a.labels["alertname"]].append({"labels": a.labels, "annotations": a.annotations})
            firing[ts] = dict(snap)
    failures = []
    for t in sc.tests:
        ts = _ms(t["eval_time"])
        got = firing.get(ts, {}).get(t["alertname"], [])
        got_labels = sorted((_strip(a["labels"], sc.target.name) for a in got), key=_key)  # dicts do not order
        exp = t.get("exp_alerts") or []
        exp_labels = sorted(({str(k): str(v) for k, v in e.get("exp_labels", {}).items()} for e in exp), key=_key)
        if sorted(map(_key, got_labels)) != sorted(map(_key, exp_labels)):
            failures.append(f"{sc.path}: at {t['eval_time']} {t['alertname']}: tuner has {got_labels or 'nothing'} "
                            f"firing, expected {exp_labels or 'nothing'}")
            continue
        for e in exp:
            if "exp_annotations" not in e:
                continue
            match = [a for a in got if _strip(a["labels"], sc.target.name) == {str(k): str(v) for k, v in
                                                                                e["exp_labels"].items()}]
            if match and match[0]["annotations"] != e["exp_annotations"]:
                failures.append(f"{sc.path}: at {t['eval_time']} {t['alertname']}: annotations "
                                f"{match[0]['annotations']} != {e['exp_annotations']}")
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
    rules_text = dump(prometheus_rules(sc.rules, [sc.target]))
    series = []
    for name, labels, values in sc.series:
        labels = {"target": sc.target.name, **labels}  # a series may name another target (tuner's own series)
        body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        series.append({"series": f"{name}{{{body}}}",
                       "values": " ".join("_" if v is None else repr(v) for v in values)})
    scope = {r.alert: r.scope for r in sc.rules.rules}
    tests = []
    for t in sc.tests:
        ts = _ms(t["eval_time"])
        own = {"target": sc.target.name} if scope.get(t["alertname"]) not in ("gpu", "tuner") else {}
        got = {_key(_strip(a["labels"], sc.target.name)): a["annotations"]
               for a in firing.get(ts, {}).get(t["alertname"], [])}
        exp = []
        for e in t.get("exp_alerts") or []:
            lbl = {str(k): str(v) for k, v in e.get("exp_labels", {}).items()}
            ann = e.get("exp_annotations", got.get(_key(lbl), {}))
            exp.append({"exp_labels": {**lbl, **own}, "exp_annotations": ann})
        tests.append({"eval_time": t["eval_time"], "alertname": t["alertname"], "exp_alerts": exp})
    doc = {"rule_files": [rules_file], "evaluation_interval": fmt_duration(sc.interval),
           "tests": [{"interval": fmt_duration(sc.interval), "input_series": series, "alert_rule_test": tests}]}
    return rules_text, dump(doc)


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
            proc = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=d, capture_output=True, text=True,
                                  timeout=120)
            if proc.returncode != 0:
                failures.append(f"{path}: promtool disagrees (files in {d}):\n{(proc.stdout + proc.stderr).strip()}")
        results[path] = failures
    return results
