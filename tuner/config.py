"""The config file: one YAML document, validated once into frozen models.

Durations are written as ``500ms``, ``5s``, ``2m``, ``1h``, ``7d`` (or bare seconds); sizes as ``10MiB``.
Every error names the file and the key (``targets[1].url``) so the operator knows what to fix.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tuner.errors import ConfigError

__all__ = ["Config", "Target", "Slo", "GpuSource", "StoreConfig", "Alerting", "load_config", "parse_config",
           "parse_duration", "DEFAULT_LISTEN"]

DEFAULT_LISTEN = "127.0.0.1:9464"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
_COMPOUND = re.compile(r"^(?:\d+(?:ms|s|m|h|d))+$")
_PART = re.compile(r"(\d+)(ms|s|m|h|d)")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|KiB|MiB|GiB)?\s*$")
_UNIT_B = {"B": 1, None: 1, "KB": 10**3, "MB": 10**6, "GB": 10**9,
           "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def parse_duration(value: Any) -> timedelta:
    """``"5s"`` / ``"2m"`` / ``90`` → timedelta; anything else is a ValueError naming the value."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 5s or 2m, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip()
        match = _DURATION.match(text)
        if match:
            seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
        elif _COMPOUND.match(text):  # Prometheus style: 1h30m, 8m45s
            seconds = sum(float(n) * _UNIT_S[u] for n, u in _PART.findall(text))
        else:
            raise ValueError(f"expected a duration like 500ms, 5s, 2m, 1h30m or 7d, got {value!r}")
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {value!r}")
    return timedelta(seconds=seconds)


def _parse_size(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        match = _SIZE.match(str(value))
        if not match:
            raise ValueError(f"expected a size like 10MiB or 500KB, got {value!r}")
        size = int(float(match.group(1)) * _UNIT_B[match.group(2)])
    if size <= 0:
        raise ValueError(f"size must be positive, got {value!r}")
    return size


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
Size = Annotated[int, BeforeValidator(_parse_size)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Slo(_Model):
    """A target's service-level objective: latency budgets at P99 and the share of requests that must meet them."""

    ttft_p99: Duration | None = None
    itl_p99: Duration | None = None
    e2e_p99: Duration | None = None
    objective: float = Field(0.99, gt=0, le=1)


class Target(_Model):
    """One inference server to watch."""

    name: str
    backend: Literal["vllm", "llamacpp"]
    url: str
    labels: dict[str, str] = Field(default_factory=dict)
    scrape_interval: Duration | None = None
    scrape_timeout: Duration | None = None
    slo: Slo | None = None
    # "direct" scrapes the server; "prometheus" reads the same series from the top-level prometheus.url.
    source: Literal["direct", "prometheus"] = "direct"
    prometheus_selector: str | None = None
    # The flags the server runs with, as far as tuner should know them (e.g. max-num-seqs: 8).
    flags: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("use letters, digits, '.', '_' or '-' (at most 63 characters)")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^\s/]+", v):
            raise ValueError(f"expected an http(s) base URL like http://127.0.0.1:8000, got {v!r}")
        return v.rstrip("/")


class GpuSource(_Model):
    """Where GPU telemetry comes from: NVML on this host, a dcgm-exporter, or nowhere."""

    source: Literal["none", "nvml", "dcgm"] = "none"
    url: str | None = None
    interval: Duration = timedelta(seconds=10)

    @model_validator(mode="after")
    def _needs_url(self) -> "GpuSource":
        if self.source == "dcgm" and not self.url:
            raise ValueError("gpu.source dcgm needs gpu.url, e.g. http://127.0.0.1:9400/metrics")
        return self


class Retention(_Model):
    """Raw samples are kept for ``raw``; older ones are thinned to one per ``rollup_step`` and kept for ``rollup``."""

    raw: Duration = timedelta(days=2)
    rollup: Duration = timedelta(days=30)
    rollup_step: Duration = timedelta(minutes=5)


class StoreConfig(_Model):
    url: str = "sqlite:///tuner.db"
    retention: Retention = Retention()


class PrometheusSource(_Model):
    url: str


class Defaults(_Model):
    scrape_interval: Duration = timedelta(seconds=5)
    scrape_timeout: Duration = timedelta(seconds=3)
    max_body_bytes: Size = 10 * 2**20
    signal_window: Duration = timedelta(minutes=5)


class Alerting(_Model):
    """Alert rules and where notifications go. No rule_files: the default pack in alerts/default.yaml."""

    rule_files: list[str] = Field(default_factory=list)
    evaluation_interval: Duration = timedelta(seconds=15)
    resend_delay: Duration = timedelta(minutes=1)
    alertmanagers: list[str] = Field(default_factory=list)
    external_url: str | None = None  # base of generatorURL; default http://<listen>

    @field_validator("alertmanagers")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        for url in v:
            if not re.match(r"^https?://[^\s/]+", url):
                raise ValueError(f"expected an Alertmanager base URL like http://127.0.0.1:9093, got {url!r}")
        return [u.rstrip("/") for u in v]


class Config(_Model):
    """The whole file."""

    targets: list[Target] = Field(default_factory=list)
    gpu: GpuSource = GpuSource()
    store: StoreConfig = StoreConfig()
    listen: str = DEFAULT_LISTEN
    defaults: Defaults = Defaults()
    prometheus: PrometheusSource | None = None
    alerting: Alerting = Alerting()

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError(f"expected HOST:PORT such as {DEFAULT_LISTEN}, got {v!r}")
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> "Config":
        seen: set[str] = set()
        for i, t in enumerate(self.targets):
            if t.name in seen:
                raise ValueError(f"targets[{i}].name: duplicate target name {t.name!r}")
            seen.add(t.name)
            if t.source == "prometheus" and self.prometheus is None:
                raise ValueError(f"targets[{i}].source: 'prometheus' needs a top-level prometheus.url")
        return self

    def target(self, name: str) -> Target:
        from tuner.errors import UnknownTargetError

        for t in self.targets:
            if t.name == name:
                return t
        raise UnknownTargetError(name, [t.name for t in self.targets])

    def interval(self, t: Target) -> timedelta:
        return t.scrape_interval or self.defaults.scrape_interval

    def timeout(self, t: Target) -> timedelta:
        return min(t.scrape_timeout or self.defaults.scrape_timeout, self.interval(t))

    @property
    def listen_host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


def _key(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_config(text: str, path: str = "<config>") -> Config:
    """Parse and validate YAML text; any problem is a ConfigError naming ``path`` and the key."""
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(path, where, f"not valid YAML: {getattr(exc, 'problem', exc)}") from None
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
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see README 'Config')"
        raise ConfigError(path, key, msg) from None


def load_config(path: str | Path) -> Config:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(p), "", f"cannot read config file: {exc.strerror or exc}") from None
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
        resolved = (path.parent / url[len(prefix):]).resolve()
        store = cfg.store.model_copy(update={"url": prefix + str(resolved)})
        return cfg.model_copy(update={"store": store})
    return cfg
