"""The config file: one YAML document, validated once into frozen models.

Durations are written as ``500ms``, ``5s``, ``2m``, ``1h``, ``7d`` (or bare seconds); sizes as ``10MiB``.
Every error names the file and the key (``targets[1].url``) so the operator knows what to fix.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from tuner.errors import ConfigError, FlagError, InputFileError, UnknownTargetError
from tuner.files import read_text
from tuner.flags import REDACTED, redact_argv_text, secret_flag, spec, tunable_spelled, validate

__all__ = [
    "Matcher",
    "parse_selector",
    "replica_groups",
    "Window",
    "parse_window",
    "in_window",
    "window_left",
    "Config",
    "Target",
    "Balancer",
    "Replica",
    "Managed",
    "Hook",
    "ApplyPolicy",
    "Slo",
    "GpuSource",
    "StoreConfig",
    "Alerting",
    "load_config",
    "parse_config",
    "parse_duration",
    "parse_interval",
    "MIN_INTERVAL",
    "DEFAULT_LISTEN",
]

DEFAULT_LISTEN = "127.0.0.1:9464"
MIN_TOKEN = 16  # characters of an API token, from a file or $TUNER_API_TOKEN alike
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*\Z")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
_COMPOUND = re.compile(r"^(?:\d+(?:ms|s|m|h|d))+\Z")
_ZERO = re.compile(r"^0+(?:\.0*)?\s*(?:ms|s|m|h|d)?\Z")
_PART = re.compile(r"(\d+)(ms|s|m|h|d)")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|KiB|MiB|GiB)?\s*\Z")
_UNIT_B = {"B": 1, None: 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")  # \Z: "$" also matches before a final newline
# HOST:PORT; an IPv6 address in brackets ([::1]:9464), as in a URL
_LISTEN = re.compile(r"(?:\[([^\]]+)\]|([A-Za-z0-9][A-Za-z0-9.-]*)):([0-9]{1,5})")
_BASE_URL = re.compile(r"https?://[^\s/]+(?:/\S*)?")  # no whitespace anywhere (a newline ends up in headers)
# systemd.unit(5): a name of [A-Za-z0-9:_.\\-], an '@' and instance for a template's, then the type suffix (tuner
# restarts a service, and its drop-in goes in <unit>.d/); no leading '-' (read as an option by systemctl) or '.'
_SYSTEMD_SERVICE = re.compile(r"[A-Za-z0-9:_\\][A-Za-z0-9:_.\\-]*(?:@[A-Za-z0-9:_.\\-]*)?\.service")
_MAX_SECONDS = 10 * 365 * 86400  # durations past ten years are typos (and timedelta overflows near 2.7 million)


class YamlLoader(yaml.SafeLoader):
    """SafeLoader whose value errors carry the line: PyYAML raises a bare ValueError for ``2001-02-30`` or
    ``!!int 0xZZ``, an AttributeError for ``!!timestamp x`` and an IndexError for an empty ``!!float`` or
    ``!!int``; here they are YAML errors with a mark."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, AttributeError, OverflowError, IndexError) as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {node.value!r} as {node.tag.rsplit(':', 1)[-1]} ({exc})", node.start_mark
            ) from None


class YamlTextError(ValueError):
    """Raised by ``load_yaml`` for any text PyYAML cannot load; ``line`` is 1-based (None if unknown)."""

    def __init__(self, line: int | None, problem: str) -> None:
        self.line, self.problem = line, problem
        super().__init__(f"line {line}: {problem}" if line else problem)


def load_yaml(text: str, loader: type[YamlLoader] = YamlLoader) -> Any:
    """Load one YAML document; every failure (bad syntax, bad characters, bad values, absurd nesting) is a
    YamlTextError naming the line, never another exception."""
    ld = None
    try:
        ld = loader(text)
        return ld.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise YamlTextError(mark.line + 1 if mark else None, str(exc.problem or exc)) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow: found before parsing starts
        raise YamlTextError(text.count("\n", 0, exc.position) + 1, str(exc).split("\n")[0]) from None
    except yaml.YAMLError as exc:
        raise YamlTextError(None, str(exc)) from None
    except RecursionError:
        raise YamlTextError(ld.get_mark().line + 1 if ld else None, "nested too deeply") from None
    finally:
        if ld is not None:
            ld.dispose()


def parse_duration(value: Any) -> timedelta:
    """``"5s"`` / ``"2m"`` / ``90`` → timedelta; anything else is a ValueError naming the value."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 5s or 2m, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = (
            float(value) if isinstance(value, float) or abs(value) < 2**53 else math.inf
        )  # float(10**400) overflows
    else:
        text = str(value).strip()
        match = _DURATION.match(text)
        if match:
            seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
        elif _COMPOUND.match(text):  # Prometheus style: 1h30m, 8m45s
            seconds = sum(float(n) * _UNIT_S[u] for n, u in _PART.findall(text))
        else:
            raise ValueError(f"expected a duration like 500ms, 5s, 2m, 1h30m or 7d, got {value!r}")
    if not seconds > 0:  # also NaN
        raise ValueError(f"duration must be positive, got {value!r}")
    if seconds > _MAX_SECONDS:
        raise ValueError(f"duration {value!r} is longer than ten years; write a shorter one")
    return timedelta(seconds=seconds)


def _parse_size(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        match = _SIZE.match(str(value))
        if not match:
            raise ValueError(f"expected a size like 10MiB or 500KB, got {value!r}")
        size_f = float(match.group(1)) * _UNIT_B[match.group(2)]
        if not math.isfinite(size_f):  # a digit string too long for a float reads as inf
            raise ValueError(f"size {value!r} is too large")
        size = int(size_f)
    if size <= 0:
        raise ValueError(f"size must be positive, got {value!r}")
    return size


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
# The shortest scrape, GPU read or rule evaluation interval: each scrape is an HTTP request to the server and a
# store write, and every signal window is read back at each evaluation. A tenth of a second keeps a fast test
# or a lab at 10 scrapes a second; 1ms (a typo of 1s or 5s) would be 1,000 requests and writes a second.
MIN_INTERVAL = timedelta(milliseconds=100)


def parse_interval(value: Any) -> timedelta:
    """A duration of at least MIN_INTERVAL (scrape, GPU and evaluation intervals)."""
    d = parse_duration(value)
    if d < MIN_INTERVAL:
        raise ValueError(
            f"{value!r} is shorter than {MIN_INTERVAL.total_seconds() * 1000:.0f}ms, the shortest "
            "interval tuner takes (a typo? scrapes and evaluations that often flood the server and the "
            "store)"
        )
    return d


Interval = Annotated[timedelta, BeforeValidator(parse_interval)]


def _duration_or_zero(value: Any) -> timedelta:
    """A duration, or 0 (``0``, ``0s``): "every time" where a key allows it (health_interval)."""
    if not isinstance(value, bool) and (value == 0 or (isinstance(value, str) and _ZERO.match(value.strip()))):
        return timedelta(0)
    return parse_duration(value)


DurationOrZero = Annotated[timedelta, BeforeValidator(_duration_or_zero)]
Size = Annotated[int, BeforeValidator(_parse_size)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Slo(_Model):
    """A target's service-level objective: latency budgets at P99 and the share of requests that must meet them."""

    ttft_p99: Duration | None = None
    itl_p99: Duration | None = None
    e2e_p99: Duration | None = None
    objective: float = Field(0.99, gt=0, le=1)


_Scalar = str | int | float | bool


class Managed(_Model):
    """A server tuner starts and supervises itself (a "load request"): model, server, flags.

    ``flags`` are tunable flags by tuner's names (tuner/flags.py) and are what applies change; ``extra_args``
    are fixed flags tuner passes as given and never changes (e.g. ``enforce-eager: true``). Host and port come
    from the target's url.
    """

    model: str
    type: Literal["llm", "embedding"] = "llm"
    # vLLM: a Python interpreter that has vllm installed; llama-server: the binary. Default: this Python / PATH.
    executable: str | None = None
    served_model_name: str | None = None  # vLLM; default: the target's name (a replica group's: the group's)
    flags: dict[str, _Scalar] = Field(default_factory=dict)
    extra_args: dict[str, _Scalar | None] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    log_dir: str = "logs"  # relative to the config file
    start_timeout: Duration = timedelta(minutes=10)
    drain_timeout: Duration = timedelta(seconds=30)  # vLLM --shutdown-timeout; llama-server's grace period
    max_restarts: int = Field(3, ge=0, le=100)  # automatic restarts after a crash, within restart_window
    restart_window: Duration = timedelta(minutes=10)
    gpus: list[int] = Field(default_factory=list)  # GPU indices it uses: two applies never share a GPU at once
    # CPU priority (0-19, like nice(1)): on a small CPU-only host a niced server leaves tuner's scrapes on time.
    nice: int = Field(0, ge=0, le=19)
    # vLLM on a CPU host: how many nice levels below the rest of the server its engine core runs, so that its
    # busy-wait on the worker gives way to the API server and the clients, and, where the kernel schedules by session
    # (autogroup), the level of the server's session against other sessions (tuner/apply/managed.py,
    # yield_engine_core); 0: as vLLM starts it. No effect where no worker is pinned to its cores (a GPU host).
    engine_core_nice: int = Field(10, ge=0, le=19)
    # Restart the server once its engine has been stalled this long (requests in flight and nothing generated or
    # finished, or /health answering while /metrics does not), journaled as a restart; None (default): never.
    restart_when_stalled: Duration | None = None

    @property
    def api_key(self) -> str | None:
        """The key the server asks its clients for (its --api-key in extra_args, any spelling, else VLLM_API_KEY or
        LLAMA_API_KEY in env): the health gate sends it as ``Authorization: Bearer``."""
        for key, value in self.extra_args.items():
            if (
                key.lstrip("-").replace("_", "-").lower() == "api-key"
                and value is not None
                and not isinstance(value, bool)
            ):
                return str(value)
        return self.env.get("VLLM_API_KEY") or self.env.get("LLAMA_API_KEY") or None

    @model_validator(mode="after")
    def _key(self) -> Managed:
        key = self.api_key
        if key is not None and not (key.isascii() and key.isprintable() and key.strip() == key and key):
            raise ValueError(
                "the api-key (extra_args or env) must be printable ASCII without spaces around it (the "
                "health gate sends it in an Authorization header)"
            )
        return self


class Hook(_Model):
    """How to apply flags to a server tuner does not own: an argv template, or a systemd drop-in.

    ``command`` elements may contain {target}, {url}, {recommendation}; an element that is exactly {flags}
    becomes the full rendered flag list and exactly {diff} the changed flags only. Never run through a shell.
    """

    command: list[str] | None = None
    systemd_unit: str | None = None
    systemd_dropin: str | None = None  # default /etc/systemd/system/<unit>.d/tuner-flags.conf
    timeout: Duration = timedelta(minutes=10)

    @field_validator("systemd_unit")
    @classmethod
    def _unit(cls, v: str | None) -> str | None:
        if v is not None and (not _SYSTEMD_SERVICE.fullmatch(v) or len(v) > 255):
            raise ValueError(
                f"expected a systemd service unit name such as vllm.service or llama@chat.service "
                f"(letters, digits, ':', '_', '.', '-', '\\', one '@' for a template; at most 255 "
                f"characters), got {v!r}"
            )
        return v

    @model_validator(mode="after")
    def _one(self) -> Hook:
        if (self.command is None) == (self.systemd_unit is None):
            raise ValueError("set exactly one of command (an argv list) or systemd_unit")
        if self.command is not None and not self.command:
            raise ValueError("command: expected a non-empty argv list")
        return self


# ---- maintenance windows (apply.maintenance_windows) ---------------------------------------------

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_WINDOW = re.compile(
    r"^\s*(daily|[A-Za-z]{3}(?:-[A-Za-z]{3})?(?:,[A-Za-z]{3}(?:-[A-Za-z]{3})?)*)\s+"
    r"(\d{2}):(\d{2})-(\d{2}):(\d{2})\s*\Z"
)


@dataclass(frozen=True)
class Window:
    """Days (0 = Monday) on which the window opens, and its minutes of the day, UTC; end < start wraps midnight."""

    days: frozenset[int]
    start_min: int
    end_min: int


def parse_window(text: str) -> Window:
    """``daily 02:00-04:00``, ``Mon-Fri 22:00-02:00``, ``Sat,Sun 00:00-06:00`` (UTC); ValueError names the text."""
    m = _WINDOW.match(text)
    if not m:
        raise ValueError(
            f"maintenance window {text!r}: expected e.g. 'daily 02:00-04:00' or 'Mon-Fri 22:00-02:00' (UTC)"
        )
    spec, h1, m1, h2, m2 = m.groups()
    if int(h1) > 23 or int(h2) > 23 or int(m1) > 59 or int(m2) > 59:
        raise ValueError(f"maintenance window {text!r}: times must be 00:00..23:59")
    days: set[int] = set()
    if spec.lower() == "daily":
        days = set(range(7))
    else:
        for part in spec.lower().split(","):
            first, _, last = part.partition("-")
            if first not in _DAYS or (last and last not in _DAYS):
                raise ValueError(f"maintenance window {text!r}: unknown day in {part!r} (use Mon..Sun)")
            a, b = _DAYS.index(first), _DAYS.index(last or first)
            days.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    start, end = int(h1) * 60 + int(m1), int(h2) * 60 + int(m2)
    if start == end:
        raise ValueError(f"maintenance window {text!r}: start and end are equal")
    return Window(frozenset(days), start, end)


def in_window(w: Window, ts: float) -> bool:
    t = datetime.fromtimestamp(ts, timezone.utc)
    minute, day = t.hour * 60 + t.minute, t.weekday()
    if w.start_min < w.end_min:
        return day in w.days and w.start_min <= minute < w.end_min
    # wraps midnight: opens on a listed day, closes the next morning
    return (day in w.days and minute >= w.start_min) or ((day - 1) % 7 in w.days and minute < w.end_min)


def window_left(windows: list[Window], ts: float) -> float:
    """Seconds from ``ts`` until none of ``windows`` is open any more (0.0 when none is open at ``ts``); windows
    that chain into each other count as one. Minute steps, at most a week."""
    if not any(in_window(w, ts) for w in windows):
        return 0.0
    edge = (ts // 60 + 1) * 60  # the next minute boundary: windows open and close on minutes
    for i in range(7 * 24 * 60):
        if not any(in_window(w, edge + i * 60) for w in windows):
            return edge + i * 60 - ts
    return float(7 * 24 * 3600)


class ApplyPolicy(_Model):
    """How flag changes reach this target and how tuner judges them."""

    mode: Literal["manual", "auto"] = "manual"
    hook: Hook | None = None
    baseline: Duration = timedelta(minutes=5)  # window before the apply that the verdict compares with
    observe: Duration = timedelta(minutes=5)  # window after the health gate
    # an inconclusive verdict keeps observing, in steps of `observe`, up to this long (default 3 x observe)
    observe_max: Duration | None = None
    # what an apply still inconclusive at observe_max does: roll back to the previous flags, or keep the new ones
    # (keep_previous and keep_new, the names before, are read as rollback and keep)
    on_inconclusive: Literal["keep", "rollback"] = "rollback"
    min_requests: int = Field(20, ge=0)  # fewer finished on either side: too little traffic, inconclusive
    # auto mode guardrails
    auto_interval: Duration = timedelta(seconds=30)  # how often auto mode re-evaluates and may apply
    min_confidence: float = Field(0.8, ge=0, le=1)
    cooldown: Duration = timedelta(minutes=30)
    max_restarts_per_hour: int = Field(2, ge=1)
    maintenance_windows: list[str] = Field(default_factory=list)  # "daily 02:00-04:00", "Sat,Sun 00:00-06:00" (UTC)
    max_consecutive_rollbacks: int = Field(2, ge=1)

    @field_validator("on_inconclusive", mode="before")
    @classmethod
    def _old_names(cls, v: object) -> object:
        return {"keep_new": "keep", "keep_previous": "rollback"}.get(v, v) if isinstance(v, str) else v

    @field_validator("maintenance_windows")
    @classmethod
    def _windows(cls, v: list[str]) -> list[str]:
        for w in v:
            parse_window(w)
        return v


class Balancer(_Model):
    """HAProxy in front of a replica group, driven through its runtime API (docs/replica-groups.md)."""

    kind: Literal["haproxy"] = "haproxy"
    socket: str  # its admin socket: `stats socket PATH mode 600 level admin` in HAProxy's global section
    backend: str  # the HAProxy backend whose servers the replicas are
    drain_timeout: Duration = timedelta(seconds=60)  # until a drained replica's sessions are gone
    up_timeout: Duration = timedelta(seconds=30)  # after `ready`, until HAProxy's own health check says UP
    # Blue/green on one host (a managed target with no replicas): this server's name in the backend, and the
    # HOST:PORT clients use (for `tuner haproxy-config`).
    server: str | None = None
    frontend: str | None = None

    @field_validator("backend", "server")
    @classmethod
    def _backend(cls, v: str | None) -> str | None:
        if v is not None and not _NAME.match(v):
            raise ValueError("use letters, digits, '.', '_' or '-' (the name HAProxy's config gives it)")
        return v

    @field_validator("frontend")
    @classmethod
    def _frontend(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^([A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\]):\d{1,5}\Z", v):
            raise ValueError(f"expected HOST:PORT where HAProxy listens for clients, got {v!r}")
        return v


class Replica(_Model):
    """One server of a replica group: its name in the balancer's backend, its own URL, and environment variables of
    its own over ``managed.env`` (e.g. CUDA_VISIBLE_DEVICES to give each replica its GPU; VLLM_CPU_OMP_THREADS_BIND
    per replica starved a restart on a two-core host, docs/replica-groups.md)."""

    name: str
    url: str
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("use letters, digits, '.', '_' or '-' (the server's name in the HAProxy backend)")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://([^/:\s]+|\[[^\]\s]+\]):\d+/?\Z", v):
            raise ValueError(
                f"expected http://HOST:PORT of this replica (tuner scrapes and starts it there), got {v!r}"
            )
        return v.rstrip("/")


class Matcher(NamedTuple):
    """One label matcher of a PromQL selector (a target's ``prometheus_selector``)."""

    label: str
    op: str  # = != =~ !~
    value: str

    def __call__(self, labels: dict[str, str]) -> bool:
        have = labels.get(self.label, "")  # an absent label matches "" (as in PromQL)
        if self.op == "=":
            return have == self.value
        if self.op == "!=":
            return have != self.value
        hit = re.fullmatch(self.value, have) is not None  # PromQL's regexes are anchored at both ends
        return hit if self.op == "=~" else not hit


_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


def parse_selector(selector: str) -> tuple[Matcher, ...]:
    """The label matchers of a selector such as ``job="vllm", instance=~"10\\.0\\..*"`` (braces optional);
    ValueError saying what is wrong."""
    text, out, pos = selector.strip().strip("{}"), [], 0
    while pos < len(text):
        m = _MATCHER.match(text, pos)
        if m is None:
            raise ValueError(f'expected label="value" (or !=, =~, !~) at {text[pos : pos + 30]!r}')
        try:
            value = json.loads(f'"{m[3]}"')
        except ValueError:
            raise ValueError(f"bad escape in {m[3]!r}") from None
        if m[2] in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"bad regex {value!r}: {exc}") from None
        out.append(Matcher(m[1], m[2], value))
        pos = m.end()
    if not out:
        raise ValueError("no label matchers")
    return tuple(out)


# ---- Kubernetes (a target's workload; its pods as the group's replicas) ----------------------------

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_KUBE_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_PORT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_REQUIREMENT = re.compile(r"\s*(!?)\s*([^\s!=,()]+)\s*(?:(==|=|!=)\s*([^\s,()]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*")


def dns_label(v: str, what: str) -> str:
    """``v`` if it is a DNS-1123 label (namespaces, container names), else a ValueError saying the rule."""
    if len(v) > 63 or not _DNS_LABEL.fullmatch(v):
        raise ValueError(
            f"{what} {v!r} is not a DNS-1123 label: at most 63 characters, lowercase letters, digits "
            "and '-', starting and ending with a letter or digit"
        )
    return v


def dns_subdomain(v: str, what: str) -> str:
    """``v`` if it is a DNS-1123 subdomain (Deployment and StatefulSet names), else a ValueError saying the rule."""
    if len(v) > 253 or not _DNS_SUBDOMAIN.fullmatch(v):
        raise ValueError(
            f"{what} {v!r} is not a DNS-1123 subdomain: at most 253 characters, lowercase letters, "
            "digits, '-' and '.', each part starting and ending with a letter or digit"
        )
    return v


def _label_key(key: str, selector: str) -> None:
    prefix, _, name = key.rpartition("/")
    if prefix:
        dns_subdomain(prefix, f"label selector {selector!r}: key prefix")
    if len(name) > 63 or not _KUBE_LABEL_NAME.fullmatch(name):
        raise ValueError(
            f"label selector {selector!r}: {key!r} is not a label key (at most 63 characters of "
            "letters, digits, '-', '_', '.', after an optional DNS prefix and '/')"
        )


def _label_value(value: str, selector: str) -> None:
    if value and (len(value) > 63 or not _KUBE_LABEL_NAME.fullmatch(value)):
        raise ValueError(
            f"label selector {selector!r}: {value!r} is not a label value (at most 63 characters of "
            "letters, digits, '-', '_', '.', starting and ending with a letter or digit)"
        )


def label_selector(selector: str) -> str:
    """A Kubernetes label selector as the API takes it (``app=vllm,tier in (a,b),!canary``), checked here so a
    typo is a config error, not an API error at run time; ValueError saying what is wrong."""
    if not selector.strip():
        raise ValueError("label selector is empty (leave it out to use the workload's own selector)")
    depth, parts, start = 0, [], 0
    for i, ch in enumerate(selector):  # commas inside "in (a,b)" do not separate requirements
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(selector[start:i])
            start = i + 1
    parts.append(selector[start:])
    for part in parts:
        m = _REQUIREMENT.fullmatch(part)
        if m is None or (m[1] and (m[3] or m[5])):
            raise ValueError(
                f"label selector {selector!r}: cannot read {part.strip()!r} (use key=value, key!=value, "
                "key in (a,b), key notin (a,b), key or !key)"
            )
        _label_key(m[2], selector)
        for value in [m[4]] if m[3] else [v.strip() for v in m[6].split(",")] if m[5] else []:
            _label_value(value, selector)
    return selector.strip()


class KubePods(_Model):
    """One target per pod of the workload (and of its canary): the group's replicas, added and removed as pods come
    and go. Found through the Kubernetes API (pods by label selector in the namespace, grouped by the workload that
    owns them) or, on a target whose ``source`` is prometheus, from the labels Prometheus's kubernetes_sd gave the
    series it scrapes (no API read for discovery)."""

    selector: str | None = None  # default: the workload's own spec.selector.matchLabels
    port: int | str | None = None  # the container port scraped, a number or its name; default: the url's port
    scheme: Literal["http", "https"] = "http"
    # source: prometheus: the labels that name each series' namespace and pod (kube-prometheus relabels them so)
    namespace_label: str = "namespace"
    pod_label: str = "pod"

    @field_validator("selector")
    @classmethod
    def _selector(cls, v: str | None) -> str | None:
        return None if v is None else label_selector(v)

    @field_validator("port")
    @classmethod
    def _port(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and not 0 < v < 65536:
            raise ValueError(f"port {v} is outside 1..65535")
        if isinstance(v, str) and (len(v) > 15 or not _PORT_NAME.fullmatch(v) or not re.search("[a-z]", v)):
            raise ValueError(
                f"port {v!r}: expected a number or a container port's name (at most 15 lowercase "
                "letters, digits and '-', with a letter)"
            )
        return v

    @field_validator("namespace_label", "pod_label")
    @classmethod
    def _prom_label(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError(f"{v!r} is not a Prometheus label name")
        return v


class Kubernetes(_Model):
    """Where a target's flags live when Kubernetes runs its server: a container's args in a Deployment (or a
    StatefulSet). Applies patch those args (the allow-listed flags only) and Kubernetes rolls the pods
    (tuner/apply/kube.py); with ``pods``, each pod is a replica of the target's group."""

    kind: Literal["Deployment", "StatefulSet"] = "Deployment"
    namespace: str
    name: str
    container: str
    canary: str | None = None  # a second Deployment beside the first (same pod labels): `apply --canary` uses it
    pods: KubePods | None = None
    rollout_timeout: Duration = timedelta(minutes=15)  # tuner's own bound, beyond the Deployment's deadline
    poll: Duration = timedelta(seconds=2)  # how often a rollout is read

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        return dns_label(v, "namespace")

    @field_validator("container")
    @classmethod
    def _container(cls, v: str) -> str:
        return dns_label(v, "container")

    @field_validator("name", "canary")
    @classmethod
    def _workload(cls, v: str | None) -> str | None:
        return None if v is None else dns_subdomain(v, "name")

    @model_validator(mode="after")
    def _canary(self) -> Kubernetes:
        if self.canary is not None and self.kind != "Deployment":
            raise ValueError("canary: a canary is a second Deployment beside a Deployment (a StatefulSet has none)")
        if self.canary is not None and self.canary == self.name:
            raise ValueError(f"canary: {self.canary!r} is the workload itself; name the second Deployment")
        return self


class KubeAccess(_Model):
    """How tuner reaches the Kubernetes API: in a pod, its ServiceAccount (in-cluster config); elsewhere a
    kubeconfig (``kubeconfig``, else $KUBECONFIG, else ~/.kube/config) and its current or named context."""

    kubeconfig: str | None = None  # relative to the config file
    context: str | None = None
    timeout: Duration = timedelta(seconds=10)  # one API request


__all__ += ["Kubernetes", "KubePods", "KubeAccess", "dns_label", "dns_subdomain", "label_selector"]


class Target(_Model):
    """One inference server to watch; or, with ``replicas``, a group of them behind a balancer (the config
    expands a group into one target per replica, named GROUP.REPLICA, that share everything but the URL)."""

    name: str
    backend: Literal["vllm", "llamacpp", "auto"]
    url: str
    labels: dict[str, str] = Field(default_factory=dict)
    scrape_interval: Interval | None = None
    scrape_timeout: Duration | None = None
    health_interval: DurationOrZero | None = None
    slo: Slo | None = None
    # "direct" scrapes the server; "prometheus" reads the same series from the top-level prometheus.url.
    source: Literal["direct", "prometheus"] = "direct"
    prometheus_selector: str | None = None
    # The flags the server runs with, as far as tuner should know them (e.g. max-num-seqs: 8).
    flags: dict[str, str | int | float | bool] = Field(default_factory=dict)
    managed: Managed | None = None
    apply: ApplyPolicy = ApplyPolicy()
    balancer: Balancer | None = None
    replicas: list[Replica] = Field(default_factory=list)
    # Set by the expansion of a group, never written in the file: the group, this replica's server name in the
    # balancer, and the group's URL (the balancer's frontend, what clients use).
    group: str | None = None
    replica: str | None = None
    group_url: str | None = None
    # Kubernetes runs the server: applies patch the workload's container args (tuner/apply/kube.py)
    kubernetes: Kubernetes | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("use letters, digits, '.', '_' or '-' (at most 63 characters)")
        return v

    @model_validator(mode="after")
    def _group(self) -> Target:
        if self.replicas and self.balancer is None:
            raise ValueError(
                "replicas: a group needs a balancer (balancer: {socket, backend}); without one a "
                "restart of any replica drops its requests"
            )
        if self.balancer is not None and not self.replicas:
            if self.balancer.server is None or self.managed is None:
                raise ValueError(
                    "balancer: list at least two replicas (a rolling apply takes one out at a time), "
                    "or, for blue/green on one host, give balancer.server (this server's name in the "
                    "backend) on a managed target (tuner starts the second server)"
                )
        elif self.balancer is not None and len(self.replicas) < 2:
            raise ValueError("balancer: list at least two replicas (a rolling apply takes one out at a time)")
        names = [r.name for r in self.replicas]
        if len(set(names)) != len(names):
            raise ValueError(f"replicas: duplicate replica name in {names}")
        urls = [r.url for r in self.replicas]
        if len(set(urls)) != len(urls):
            raise ValueError(f"replicas: two replicas share a URL in {urls}")
        return self

    @model_validator(mode="after")
    def _kube(self) -> Target:
        k = self.kubernetes
        if k is None:
            return self
        if self.managed is not None:
            raise ValueError("kubernetes: Kubernetes starts this server, not tuner; remove managed:")
        if self.balancer is not None or self.replicas:
            raise ValueError(
                "kubernetes: the workload's pods are the replicas (kubernetes.pods), behind its "
                "Service; remove balancer: and replicas:"
            )
        if self.apply.hook is not None:
            raise ValueError("kubernetes: an apply patches the workload's container args; remove apply.hook")
        if self.apply.mode == "auto" and k.pods is not None:
            raise ValueError(
                "kubernetes: apply.mode auto is not supported on a Kubernetes pods group: auto mode's "
                "guardrails (restart budget, halt after rollbacks) count per target, and every rollout "
                "makes new pods; use mode: manual"
            )
        return self

    @property
    def served_name(self) -> str:
        """The model name clients ask a managed vLLM for: ``managed.served_model_name``, else the group's name
        (every replica behind the balancer must answer to the same one), else the target's."""
        return (self.managed.served_model_name if self.managed else None) or self.group or self.name

    def members(self) -> list[Target]:
        """The group's replicas as targets of their own (itself when it is not a group)."""
        if not self.replicas:
            return [self]
        labels = lambda r: {**self.labels, "group": self.name, "replica": r.name}  # noqa: E731
        managed = lambda r: (
            self.managed.model_copy(update={"env": {**self.managed.env, **r.env}})  # noqa: E731
            if self.managed is not None and r.env
            else self.managed
        )
        return [
            self.model_copy(
                update={
                    "name": f"{self.name}.{r.name}",
                    "url": r.url,
                    "replicas": [],
                    "group": self.name,
                    "replica": r.name,
                    "group_url": self.url,
                    "labels": labels(r),
                    "managed": managed(r),
                }
            )
            for r in self.replicas
        ]

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not _BASE_URL.fullmatch(v):
            raise ValueError(f"expected an http(s) base URL like http://127.0.0.1:8000, got {v!r}")
        return v.rstrip("/")

    @field_validator("prometheus_selector")
    @classmethod
    def _selector(cls, v: str | None) -> str | None:
        if v is not None:
            parse_selector(v)  # its ValueError names what to fix; the key is named by the config's error
        return v

    @model_validator(mode="after")
    def _known_flags(self) -> Target:
        """The ``flags`` tuner knows (its allow-list) hold their type and bounds here, when the config is read, not
        first when a change is built from them; names it does not know are the server's business and pass."""
        if self.backend == "auto":
            return self
        for name, value in self.flags.items():
            for candidate in (name, "--" + name):
                try:
                    spec(self.backend, candidate)
                except FlagError:
                    continue
                try:
                    validate(self.backend, candidate, value)
                except FlagError as exc:
                    raise ValueError(f"flags.{name}: {exc}") from None
                break
        return self

    @model_validator(mode="after")
    def _managed(self) -> Target:
        if self.managed is None:
            if self.backend == "auto":
                raise ValueError("backend auto needs managed.model to choose from (a .gguf file: llamacpp, else vllm)")
            return self

        backend = self.backend
        if backend == "auto":
            backend = "llamacpp" if self.managed.model.endswith(".gguf") else "vllm"
            object.__setattr__(self, "backend", backend)
        for name, value in self.managed.flags.items():
            try:
                validate(backend, name, value)
            except FlagError as exc:
                raise ValueError(f"managed.flags.{name}: {exc}") from None
        for key in self.managed.extra_args:
            if (tunable := tunable_spelled(backend, key)) is not None:  # it would be on the argv twice
                raise ValueError(
                    f"managed.extra_args.{key}: sets the tunable flag {tunable.name} "
                    f"({tunable.cli[backend]}); put it in managed.flags, where tuner can change it"
                )
        host = re.match(r"^https?://([^/:]+|\[[^\]]+\])(?::(\d+))?\Z", self.url)
        if host is None or host.group(2) is None:
            raise ValueError(
                f"a managed target's url must be http://HOST:PORT (tuner starts the server there), got {self.url!r}"
            )
        return self

    @property
    def host_port(self) -> tuple[str, int]:
        m = re.match(r"^https?://([^/:]+|\[[^\]]+\])(?::(\d+))?", self.url)
        assert m is not None
        return m.group(1).strip("[]"), int(m.group(2) or 80)


class GpuSource(_Model):
    """Where GPU telemetry comes from: NVML on this host, a dcgm-exporter, or nowhere."""

    source: Literal["none", "nvml", "dcgm"] = "none"
    url: str | None = None
    interval: Interval = timedelta(seconds=10)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not _BASE_URL.fullmatch(v):
            raise ValueError(f"expected the exporter's URL like http://127.0.0.1:9400/metrics, got {v!r}")
        return v

    @model_validator(mode="after")
    def _needs_url(self) -> GpuSource:
        if self.source == "dcgm" and not self.url:
            raise ValueError("gpu.source dcgm needs gpu.url, e.g. http://127.0.0.1:9400/metrics")
        return self


class Retention(_Model):
    """Raw samples are kept for ``raw``; older ones are thinned to one per ``rollup_step`` and kept for ``rollup``."""

    raw: Duration = timedelta(days=2)
    rollup: Duration = timedelta(days=30)
    rollup_step: Duration = timedelta(minutes=5)

    @model_validator(mode="after")
    def _order(self) -> Retention:
        if self.raw > self.rollup:  # everything older than rollup is deleted: raw samples with it
            raise ValueError(
                f"raw ({self.raw}) is longer than rollup ({self.rollup}): every sample would be deleted "
                "at the rollup age; make rollup at least as long as raw"
            )
        return self


class StoreConfig(_Model):
    url: str = "sqlite:///tuner.db"
    retention: Retention = Retention()


class PrometheusSource(_Model):
    url: str

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not _BASE_URL.fullmatch(v):
            raise ValueError(f"expected Prometheus's base URL like http://127.0.0.1:9090, got {v!r}")
        return v


class Defaults(_Model):
    scrape_interval: Interval = timedelta(seconds=5)
    scrape_timeout: Duration = timedelta(seconds=3)
    # vLLM's /health is asked at most this often (0s: at every scrape); after an answer other than 200, or a
    # failed scrape, at the next one. llama-server's is asked at every scrape (it says whether the model is loaded).
    health_interval: DurationOrZero = timedelta(seconds=15)
    max_body_bytes: Size = 10 * 2**20
    signal_window: Duration = timedelta(minutes=5)


class Alerting(_Model):
    """Alert rules and where notifications go. No rule_files: the default pack in alerts/default.yaml."""

    rule_files: list[str] = Field(default_factory=list)
    evaluation_interval: Interval = timedelta(seconds=15)
    resend_delay: Duration = timedelta(minutes=1)
    alertmanagers: list[str] = Field(default_factory=list)
    external_url: str | None = None  # base of generatorURL; default http://<listen>

    @field_validator("external_url")
    @classmethod
    def _external(cls, v: str | None) -> str | None:
        if v is not None and not _BASE_URL.fullmatch(v):
            raise ValueError(f"expected a base URL like https://tuner.example.com, got {v!r}")
        return v

    @field_validator("alertmanagers")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        for url in v:
            if not _BASE_URL.fullmatch(url):
                raise ValueError(f"expected an Alertmanager base URL like http://127.0.0.1:9093, got {url!r}")
        return [u.rstrip("/") for u in v]


class Api(_Model):
    """tuner's HTTP actions (apply, rollback): off unless a token is configured (here or $TUNER_API_TOKEN)."""

    token_file: str | None = None  # relative to the config file; the file holds the token alone

    def token(self, config_dir: Path | None = None) -> str | None:
        """The token from ``token_file``, else ``$TUNER_API_TOKEN`` (None: neither is set); either way at least
        MIN_TOKEN characters, or a ConfigError naming where it came from."""
        import os

        if self.token_file is None:
            text = os.environ.get("TUNER_API_TOKEN", "").strip()
            if not text:
                return None
            where, key = "environment", "TUNER_API_TOKEN"
        else:
            path = Path(self.token_file)
            if not path.is_absolute() and config_dir is not None:
                path = config_dir / path
            try:
                text = read_text(path, max_bytes=4096).strip()
            except InputFileError as exc:  # missing, not UTF-8, far longer than a token
                raise ConfigError("config", "api.token_file", str(exc)) from None
            where, key = "config", "api.token_file"
        if len(text) < MIN_TOKEN:
            raise ConfigError(
                where,
                key,
                f"the token must be at least {MIN_TOKEN} characters (it is {len(text)}); "
                "generate one with `openssl rand -hex 32`",
            )
        return text


class Config(_Model):
    """The whole file."""

    targets: list[Target] = Field(default_factory=list)
    gpu: GpuSource = GpuSource()
    store: StoreConfig = StoreConfig()
    listen: str = DEFAULT_LISTEN
    defaults: Defaults = Defaults()
    prometheus: PrometheusSource | None = None
    alerting: Alerting = Alerting()
    api: Api = Api()
    kubernetes: KubeAccess = KubeAccess()

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        m = _LISTEN.fullmatch(v)
        if m is None or int(m[3]) > 65535:
            raise ValueError(
                f"expected HOST:PORT such as {DEFAULT_LISTEN} (an IPv6 address in brackets: [::1]:9464), got {v!r}"
            )
        if m[1] is not None:
            try:
                ipaddress.IPv6Address(m[1])
            except ValueError:
                raise ValueError(f"{m[1]!r} in {v!r} is not an IPv6 address") from None
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        # A replica group becomes one target per replica (scraped, alerted and judged each on its own).
        object.__setattr__(self, "targets", [m for t in self.targets for m in t.members()])
        seen: set[str] = set()
        for i, t in enumerate(self.targets):
            if t.name in seen:
                raise ValueError(f"targets[{i}].name: duplicate target name {t.name!r}")
            seen.add(t.name)
            if t.source == "prometheus" and self.prometheus is None:
                raise ValueError(f"targets[{i}].source: 'prometheus' needs a top-level prometheus.url")
        return self

    @property
    def secrets(self) -> tuple[str, ...]:
        """Credentials the config hands servers (values of secret flags in managed.extra_args, secret-named
        managed.env values), longest first: what redact() hides."""
        targets, found = self._secrets
        return found if targets is self.targets else self._find_secrets()[1]  # a model_copy with other targets

    @cached_property
    def _secrets(self) -> tuple[list[Target], tuple[str, ...]]:
        return self._find_secrets()

    def _find_secrets(self) -> tuple[list[Target], tuple[str, ...]]:
        found: set[str] = set()
        for t in self.targets:
            if t.managed is None:
                continue
            found.update(
                str(v)
                for k, v in t.managed.extra_args.items()
                if secret_flag(k) and v is not None and not isinstance(v, bool)
            )
            found.update(v for k, v in t.managed.env.items() if secret_flag(k))
        # shorter ones are hidden by their place in an argv only (as text they would hide innocent digits)
        return self.targets, tuple(sorted((v for v in found if len(v) >= 4), key=len, reverse=True))

    def redact(self, text: str) -> str:
        """``text`` as it may be shown (journal, API, logs): every secret value and secret flag's value as ***."""
        text = redact_argv_text(text)
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def group(self, t: Target) -> list[Target]:
        """The replicas of ``t``'s group, in the order the file lists them (``[t]`` when it is in none)."""
        return replica_groups(self.targets).get(t.group, [t]) if t.group else [t]

    @cached_property
    def _by_name(self) -> tuple[list[Target], dict[str, Target]]:
        return self.targets, {t.name: t for t in self.targets}

    def target(self, name: str) -> Target:
        """The target called ``name`` (a dict lookup: the daemon asks for every target on every tick)."""
        indexed, by_name = self._by_name
        if indexed is not self.targets:  # a model_copy carried the index of another target list
            by_name = {t.name: t for t in self.targets}
        try:
            return by_name[name]
        except KeyError:
            raise UnknownTargetError(name, [t.name for t in self.targets]) from None

    def interval(self, t: Target) -> timedelta:
        return t.scrape_interval or self.defaults.scrape_interval

    def health_interval(self, t: Target) -> timedelta:
        return t.health_interval if t.health_interval is not None else self.defaults.health_interval

    def timeout(self, t: Target) -> timedelta:
        return min(t.scrape_timeout or self.defaults.scrape_timeout, self.interval(t))

    @property
    def listen_host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def listen_url(self) -> str:
        """``http://HOST:PORT`` of the listener (an IPv6 host in brackets, as ``listen`` writes it)."""
        return f"http://{self.listen}"


def _key(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def replica_groups(targets: Iterable[Target]) -> dict[str, list[Target]]:
    """Each replica group's targets (GROUP.REPLICA, as the config expands a group), in the order the file lists
    them; targets in no group are left out."""
    out: dict[str, list[Target]] = {}
    for t in targets:
        if t.group:
            out.setdefault(t.group, []).append(t)
    return out


def parse_config(text: str, path: str = "<config>") -> Config:
    """Parse and validate YAML text; any problem is a ConfigError naming ``path`` and the key."""
    try:
        data = load_yaml(text) if text.strip() else {}
    except YamlTextError as exc:
        raise ConfigError(path, f"line {exc.line}" if exc.line else "", f"not valid YAML: {exc.problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, "", f"expected a mapping at the top level, got {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        # A misspelt key also makes the real one "missing": name the misspelling, it is the cause.
        err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        msg = err["msg"].removeprefix("Value error, ")
        key = _key(err["loc"])
        if msg.startswith("targets[") and ": " in msg:  # cross-check errors carry their own key
            key, _, msg = msg.partition(": ")
        if msg.startswith(("managed.", "apply.", "flags.")) and ": " in msg:  # a target check that names its sub-key
            sub, _, msg = msg.partition(": ")
            key = f"{key}.{sub}"
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see docs/configuration.md)"
        raise ConfigError(path, key, msg) from None


def load_config(path: str | Path) -> Config:
    p = Path(path)
    try:
        text = read_text(p)
    except InputFileError as exc:  # missing, not UTF-8, larger than any config
        raise ConfigError(str(p), "", f"cannot read config file: {exc.reason}") from None
    cfg = parse_config(text, str(p))
    return _resolve_rule_files(_resolve_store_path(cfg, p), p)


def _resolve_rule_files(cfg: Config, path: Path) -> Config:
    files = [str((path.parent / f).resolve()) for f in cfg.alerting.rule_files]
    return cfg.model_copy(update={"alerting": cfg.alerting.model_copy(update={"rule_files": files})})


def _resolve_store_path(cfg: Config, path: Path) -> Config:
    """A relative SQLite path is relative to the config file, not to wherever tuner was started."""
    url = cfg.store.url
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/") and url != "sqlite:///:memory:":
        resolved = (path.parent / url[len(prefix) :]).resolve()
        store = cfg.store.model_copy(update={"url": prefix + str(resolved)})
        return cfg.model_copy(update={"store": store})
    return cfg
