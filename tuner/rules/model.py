"""Alert rule files: the model, and a loader whose every error names the file, the line and the reason.

groups:
  - name: vllm
    interval: 15s               # evaluation interval of the group
    rules:
      - alert: KVCacheHigh
        signal: kv_cache_usage   # see tuner/rules/signals.py (`tuner alerts signals` lists them)
        op: ">"
        threshold: 0.95          # or `slo`: each target's SLO (ttft_p99, itl_p99, e2e_p99, goodput_ratio)
        window: 5m               # the window the signal is computed over
        for: 5m
        keep_firing_for: 0s
        backend: vllm            # vllm | llamacpp | any (target, GPU and tuner signals)
        labels: {severity: critical}
        annotations: {summary: "KV cache {{ $value | humanizePercentage }} on {{ $labels.target }}"}
        overrides:               # per target: threshold and/or for
          chat-a: {threshold: 0.9}
        over: targets            # targets (each one) | groups: each replica group once, over what its
                                 # replicas served together (engine signals only; overrides by group name)
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import yaml

from tuner.config import Target, YamlLoader, YamlTextError, load_yaml, parse_duration, parse_interval
from tuner.errors import InputFileError, RuleFileError
from tuner.files import read_text
from tuner.rules.signals import SIGNALS, known_signals
from tuner.rules.templates import check

__all__ = ["Rule", "RuleGroup", "RuleSet", "default_rule_files", "load_rule_files", "parse_rules", "OPS", "SLO_FIELDS"]

# Signals whose threshold can be each target's SLO (`threshold: slo`), and the SLO field it reads.
SLO_FIELDS = {"ttft_p99": "ttft_p99", "itl_p99": "itl_p99", "e2e_p99": "e2e_p99", "goodput_ratio": "objective"}

OPS = {
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_RULE_KEYS = {
    "alert",
    "signal",
    "op",
    "threshold",
    "window",
    "for",
    "keep_firing_for",
    "backend",
    "labels",
    "annotations",
    "overrides",
    "over",
}


@dataclass(frozen=True)
class Override:
    threshold: float | None = None
    for_: timedelta | None = None


@dataclass(frozen=True)
class Rule:
    alert: str
    signal: str
    op: str
    threshold: float
    window: timedelta
    for_: timedelta
    keep_firing_for: timedelta
    backend: Literal["vllm", "llamacpp", "any"]
    labels: dict[str, str]
    annotations: dict[str, str]
    overrides: dict[str, Override]
    source: str  # "file:line", for messages
    over: Literal["targets", "groups"] = "targets"  # groups: once per replica group, on its replicas together

    @property
    def scope(self) -> str:
        return SIGNALS[self.signal].scope

    @property
    def from_slo(self) -> bool:
        return math.isnan(self.threshold)

    def threshold_for(self, target: Target | None) -> float | None:
        """The threshold for one target: its override, its SLO (threshold: slo), or the rule's."""
        o = self.overrides.get(target.name if target else "")
        if o and o.threshold is not None:
            return o.threshold
        if not self.from_slo:
            return self.threshold
        if target is None or target.slo is None:
            return None  # no SLO, no rule for this target
        value = getattr(target.slo, SLO_FIELDS[self.signal])
        return value.total_seconds() if isinstance(value, timedelta) else value

    def hold_for(self, target: str | None) -> timedelta:  # by target name
        o = self.overrides.get(target or "")
        return o.for_ if o and o.for_ is not None else self.for_


@dataclass(frozen=True)
class RuleGroup:
    name: str
    interval: timedelta
    rules: tuple[Rule, ...]

    def key(self, rule: Rule) -> str:
        """The name alert state is kept under: an alert name may appear in several groups."""
        return f"{self.name}/{rule.alert}"


@dataclass(frozen=True)
class RuleSet:
    groups: tuple[RuleGroup, ...] = ()
    files: tuple[str, ...] = ()

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(r for g in self.groups for r in g.rules)


class _LineLoader(YamlLoader):
    """SafeLoader that remembers the line of every mapping (as the key ``__line__``)."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    mapping: dict[str, Any] = loader.construct_mapping(node, deep=True)  # type: ignore[assignment]  # YAML keys
    mapping["__line__"] = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _err(path: str, line: int | None, reason: str) -> RuleFileError:
    return RuleFileError(path, line, reason)


def _duration(
    value: Any, path: str, line: int, key: str, *, allow_zero: bool = False, interval: bool = False
) -> timedelta:
    if allow_zero and value in (0, "0", "0s"):
        return timedelta(0)
    try:
        return parse_interval(value) if interval else parse_duration(value)
    except ValueError as exc:
        raise _err(path, line, f"{key}: {exc}") from None


def _str_map(value: Any, path: str, line: int, key: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _err(path, line, f"{key}: expected a mapping of names to strings")
    out = {}
    for k, v in value.items():
        if k == "__line__":
            continue
        if not _NAME.match(str(k)) or isinstance(v, (dict, list)) or v is None:
            shown = k if _NAME.match(str(k)) else repr(str(k))  # one line, whatever the key holds
            raise _err(path, value.get("__line__", line), f"{key}.{shown}: expected a label name and a string value")
        out[str(k)] = str(v)
    return out


def _rule(raw: Any, path: str, group_line: int) -> Rule:
    if not isinstance(raw, dict):
        raise _err(path, group_line, "each rule must be a mapping with at least alert, signal, op, threshold")
    line = raw["__line__"]
    unknown = set(raw) - _RULE_KEYS - {"__line__"}
    if unknown:
        raise _err(path, line, f"unknown key {sorted(unknown)[0]!r} (rule keys: {', '.join(sorted(_RULE_KEYS))})")
    for key in ("alert", "signal", "op", "threshold"):
        if key not in raw:
            raise _err(path, line, f"rule is missing {key!r}")
    alert = str(raw["alert"])
    if not _NAME.match(alert):
        raise _err(path, line, f"alert: {alert!r} is not a valid alert name (letters, digits, _)")
    signal = str(raw["signal"])
    if signal not in SIGNALS:
        raise _err(path, line, f"{alert}: unknown signal {signal!r}; known signals: {known_signals()}")
    op = str(raw["op"])
    if op not in OPS:
        raise _err(path, line, f"{alert}: op {op!r} is not one of {' '.join(OPS)}")
    threshold = raw["threshold"]
    if threshold == "slo":
        if signal not in SLO_FIELDS:
            raise _err(path, line, f"{alert}: threshold 'slo' works for {', '.join(SLO_FIELDS)} only")
        threshold = math.nan  # taken from each target's slo
    elif isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise _err(path, line, f"{alert}: threshold must be a number or 'slo', got {threshold!r}")
    elif isinstance(threshold, int) and abs(threshold) >= 2**1023:  # float() would overflow
        raise _err(path, line, f"{alert}: threshold {threshold} is too large")
    elif not math.isfinite(threshold):  # .nan compares false with everything (and NaN stands for 'slo' here)
        raise _err(path, line, f"{alert}: threshold must be a finite number, got {threshold!r}")
    spec = SIGNALS[signal]
    backend = str(raw.get("backend", "vllm" if spec.scope == "engine" else "any"))
    # a target signal read for any backend may be restricted to one backend's targets
    if backend not in spec.promql and not (spec.scope != "engine" and (backend == "any" or "any" in spec.promql)):
        raise _err(
            path,
            line,
            f"{alert}: signal {signal} has no value for backend {backend!r} (it has: {', '.join(spec.promql)})",
        )
    over = str(raw.get("over", "targets"))
    if over not in ("targets", "groups"):
        raise _err(path, line, f"{alert}: over: {over!r} is not 'targets' or 'groups'")
    if over == "groups" and spec.scope != "engine":
        raise _err(
            path,
            line,
            f"{alert}: over: groups works for engine signals only ({signal} is a {spec.scope} "
            "signal: it is evaluated for each target)",
        )
    overrides = {}
    raw_over = raw.get("overrides") or {}
    if not isinstance(raw_over, dict):
        raise _err(path, line, f"{alert}: overrides must map target names to {{threshold, for}}")
    if spec.scope == "tuner" and any(k != "__line__" for k in raw_over):
        raise _err(
            path,
            line,
            f"{alert}: {signal} has one value for the whole tuner: overrides by target do not "
            "apply; set its threshold and for",
        )
    for target, o in raw_over.items():
        if target == "__line__":
            continue
        if not isinstance(o, dict) or set(o) - {"threshold", "for", "__line__"}:
            raise _err(path, raw_over.get("__line__", line), f"{alert}: overrides.{target} may set threshold and for")
        t = o.get("threshold")
        if t is not None and (
            isinstance(t, bool)
            or not isinstance(t, (int, float))
            or (isinstance(t, int) and abs(t) >= 2**1023)
            or not math.isfinite(t)
        ):
            raise _err(path, o["__line__"], f"{alert}: overrides.{target}.threshold must be a finite number, got {t!r}")
        f = _duration(o["for"], path, o["__line__"], f"overrides.{target}.for", allow_zero=True) if "for" in o else None
        overrides[str(target)] = Override(None if t is None else float(t), f)
    annotations = _str_map(raw.get("annotations"), path, line, "annotations")
    for key, text in annotations.items():
        try:
            check(text)
        except ValueError as exc:
            raise _err(path, line, f"{alert}: annotations.{key}: {exc}") from None
    return Rule(
        alert=alert,
        signal=signal,
        op=op,
        threshold=float(threshold),
        window=_duration(raw.get("window", "5m"), path, line, "window"),
        for_=_duration(raw.get("for", 0), path, line, "for", allow_zero=True),
        keep_firing_for=_duration(raw.get("keep_firing_for", 0), path, line, "keep_firing_for", allow_zero=True),
        backend=backend,  # type: ignore[arg-type]
        labels=_str_map(raw.get("labels"), path, line, "labels"),
        annotations=annotations,
        overrides=overrides,
        source=f"{path}:{line}",
        over=over,  # type: ignore[arg-type]
    )


def parse_rules(text: str, path: str = "<rules>", default_interval: timedelta = timedelta(seconds=15)) -> RuleSet:
    try:
        doc = load_yaml(text, _LineLoader)
    except YamlTextError as exc:
        raise _err(path, exc.line, f"not valid YAML: {exc.problem}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
        raise _err(path, 1, "expected a top-level 'groups:' list")
    groups, names = [], set()
    for i, g in enumerate(doc["groups"]):
        if not isinstance(g, dict) or "name" not in g or not isinstance(g.get("rules"), list):
            raise _err(
                path,
                g["__line__"] if isinstance(g, dict) else doc["__line__"],  # a list item has no line
                f"groups[{i}]: each group needs a name and a rules list",
            )
        if isinstance(g["name"], (dict, list)) or g["name"] is None:
            raise _err(path, g["__line__"], f"group name must be a string, got {g['name']!r}")
        if str(g["name"]) in names:
            raise _err(path, g["__line__"], f"duplicate group name {g['name']!r}")
        names.add(str(g["name"]))
        extra = set(g) - {"name", "interval", "rules", "__line__"}
        if extra:
            raise _err(path, g["__line__"], f"unknown group key {sorted(extra)[0]!r} (name, interval, rules)")
        interval = (
            _duration(g["interval"], path, g["__line__"], "interval", interval=True)
            if "interval" in g
            else default_interval
        )
        rules = tuple(_rule(r, path, g["__line__"]) for r in g["rules"])
        dup = [r for i, r in enumerate(rules) if r.alert in {x.alert for x in rules[:i]}]
        if dup:
            raise _err(
                path,
                int(dup[0].source.rsplit(":", 1)[1]),
                f"alert {dup[0].alert!r} appears twice in group {g['name']!r}",
            )
        groups.append(RuleGroup(str(g["name"]), interval, rules))
    return RuleSet(tuple(groups), (path,))


def default_rule_files() -> list[str]:
    """alerts/default.yaml beside the package (checkout / editable install), or $TUNER_ALERTS_DIR."""
    base = Path(os.environ.get("TUNER_ALERTS_DIR") or Path(__file__).resolve().parents[2] / "alerts")
    return [str(base / "default.yaml")]


def load_rule_files(paths: Sequence[str | Path], default_interval: timedelta = timedelta(seconds=15)) -> RuleSet:
    """Load every file or none: any error raises, so a caller keeps its last good set."""
    groups: list[RuleGroup] = []
    files: list[str] = []
    seen: dict[str, str] = {}
    for p in paths:
        path = Path(p)
        try:
            text = read_text(path)
        except InputFileError as exc:  # missing, not UTF-8, larger than any rule file
            raise _err(str(path), None, exc.reason) from None
        rs = parse_rules(text, str(path), default_interval)
        for g in rs.groups:
            if g.name in seen:
                raise _err(str(path), None, f"group {g.name!r} is also defined in {seen[g.name]}")
            seen[g.name] = str(path)
        groups += rs.groups
        files.append(str(path))
    return RuleSet(tuple(groups), tuple(files))
