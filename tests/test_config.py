"""The config file: a full example parses into typed values; every error names the file and the key."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from tuner.config import load_config, parse_config
from tuner.errors import ConfigError

FULL = """\
listen: 0.0.0.0:9464
defaults:
  scrape_interval: 2s
  scrape_timeout: 1500ms
  max_body_bytes: 4MiB
  signal_window: 10m
targets:
  - name: gpu-box.vllm
    backend: vllm
    url: http://10.0.0.5:8000/
    labels: {team: search}
    scrape_interval: 1s
    slo:
      ttft_p99: 500ms
      itl_p99: 50ms
      e2e_p99: 1m
      objective: 0.95
  - name: laptop
    backend: llamacpp
    url: http://127.0.0.1:8080
    scrape_timeout: 5s
    source: prometheus
    prometheus_selector: '{job="llama"}'
prometheus:
  url: http://127.0.0.1:9090
gpu:
  source: dcgm
  url: http://127.0.0.1:9400/metrics
  interval: 30s
store:
  url: sqlite:///data/tuner.db
  retention:
    raw: 1d
    rollup: 90d
    rollup_step: 10m
"""


def _write(tmp_path: Path, text: str, name: str = "tuner.yaml") -> Path:
    path = tmp_path / "conf" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_full_example_parses_into_typed_values(tmp_path: Path) -> None:
    path = _write(tmp_path, FULL)
    cfg = load_config(path)

    assert cfg.listen_host_port == ("0.0.0.0", 9464)
    assert cfg.defaults.scrape_interval == timedelta(seconds=2)
    assert cfg.defaults.scrape_timeout == timedelta(milliseconds=1500)
    assert cfg.defaults.max_body_bytes == 4 * 1024 * 1024
    assert cfg.defaults.signal_window == timedelta(minutes=10)

    vllm, llama = cfg.targets
    assert (vllm.name, vllm.backend, vllm.url) == ("gpu-box.vllm", "vllm", "http://10.0.0.5:8000")  # "/" trimmed
    assert vllm.labels == {"team": "search"}
    assert vllm.slo is not None
    assert vllm.slo.ttft_p99 == timedelta(milliseconds=500)
    assert vllm.slo.itl_p99 == timedelta(milliseconds=50)
    assert vllm.slo.e2e_p99 == timedelta(minutes=1)
    assert vllm.slo.objective == 0.95
    assert cfg.interval(vllm) == timedelta(seconds=1)
    # the target's own interval (1s) caps the default timeout (1.5s)
    assert cfg.timeout(vllm) == timedelta(seconds=1)

    assert (llama.backend, llama.source, llama.prometheus_selector) == ("llamacpp", "prometheus", '{job="llama"}')
    assert cfg.interval(llama) == timedelta(seconds=2)  # the default
    assert cfg.timeout(llama) == timedelta(seconds=2)  # 5s capped by the 2s interval
    assert cfg.prometheus is not None and cfg.prometheus.url == "http://127.0.0.1:9090"

    assert (cfg.gpu.source, cfg.gpu.url, cfg.gpu.interval) == (
        "dcgm",
        "http://127.0.0.1:9400/metrics",
        timedelta(seconds=30),
    )
    assert cfg.store.retention.raw == timedelta(days=1)
    assert cfg.store.retention.rollup == timedelta(days=90)
    assert cfg.store.retention.rollup_step == timedelta(minutes=10)
    # relative to the config file's directory, not to the working directory
    assert cfg.store.url == f"sqlite:///{(path.parent / 'data' / 'tuner.db').resolve()}"


def test_absolute_and_memory_sqlite_urls_are_left_alone(tmp_path: Path) -> None:
    absolute = load_config(_write(tmp_path, "store:\n  url: sqlite:////var/lib/tuner/t.db\n", "a.yaml"))
    memory = load_config(_write(tmp_path, "store:\n  url: 'sqlite:///:memory:'\n", "m.yaml"))
    assert absolute.store.url == "sqlite:////var/lib/tuner/t.db"
    assert memory.store.url == "sqlite:///:memory:"


def test_empty_file_is_all_defaults(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, ""))
    assert cfg.targets == []
    assert cfg.gpu.source == "none"
    assert cfg.defaults.scrape_interval == timedelta(seconds=5)


def _error(tmp_path: Path, text: str) -> tuple[ConfigError, Path]:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value, path


TARGET = "targets:\n  - name: a\n    backend: vllm\n    url: http://127.0.0.1:8000\n"


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        pytest.param(
            "targets:\n  - name: a\n    backend: vllm\n    urll: http://127.0.0.1:8000\n",
            "targets[0].urll",
            "unknown key",
            id="unknown-key",
        ),
        pytest.param(
            "defaults:\n  scrape_interval: 5 parsecs\n", "defaults.scrape_interval", "5 parsecs", id="bad-duration"
        ),
        pytest.param(
            "defaults:\n  max_body_bytes: 3 lightyears\n", "defaults.max_body_bytes", "3 lightyears", id="bad-size"
        ),
        pytest.param(
            "targets:\n  - {name: a, backend: tgi, url: 'http://127.0.0.1:8000'}\n",
            "targets[0].backend",
            "'vllm', 'llamacpp' or 'auto'",
            id="bad-backend",
        ),
        pytest.param(
            TARGET + "  - {name: a, backend: llamacpp, url: 'http://127.0.0.1:8080'}\n",
            "targets[1].name",
            "duplicate target name 'a'",
            id="duplicate-name",
        ),
        pytest.param("gpu:\n  source: dcgm\n", "gpu", "gpu.url", id="dcgm-without-url"),
        pytest.param(
            TARGET + "    source: prometheus\n",
            "targets[0].source",
            "prometheus.url",
            id="prometheus-source-without-url",
        ),
        pytest.param(
            "targets:\n  - {name: a, backend: vllm, url: '127.0.0.1:8000'}\n",
            "targets[0].url",
            "http(s) base URL",
            id="url-without-scheme",
        ),
        pytest.param("listen: '9464'\n", "listen", "HOST:PORT", id="listen-without-host"),
    ],
)
def test_each_error_names_the_file_and_the_key(tmp_path: Path, text: str, key: str, says: str) -> None:
    err, path = _error(tmp_path, text)
    assert err.path == str(path)
    assert err.key == key
    assert says in err.reason
    assert str(err).startswith(f"{path}: {key}: ")


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    lines = ["targets:", "  - name: a", "    backend: vllm: llamacpp", "    url: http://127.0.0.1:8000"]
    err, path = _error(tmp_path, "\n".join(lines) + "\n")
    assert err.key == "line 3"  # the second ": " on line 3
    assert "not valid YAML" in err.reason
    assert str(err).startswith(f"{path}: line 3: not valid YAML")


def test_bad_indentation_names_its_line(tmp_path: Path) -> None:
    lines = ["targets:", "  - {name: a, backend: vllm, url: 'http://127.0.0.1:8000'}", "    oops: 1"]
    err, _ = _error(tmp_path, "\n".join(lines) + "\n")
    assert err.key == "line 3"  # the line that breaks the block


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "tuner.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.path == str(path)
    assert "cannot read config file" in str(info.value)


def test_top_level_list_is_rejected(tmp_path: Path) -> None:
    err, path = _error(tmp_path, "- name: a\n- name: b\n")
    assert err.key == ""
    assert str(err) == f"{path}: expected a mapping at the top level, got list"


def test_parse_config_without_a_file_uses_a_placeholder_name() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("defaults:\n  scrape_timeout: -1s\n")
    assert str(info.value).startswith("<config>: defaults.scrape_timeout: ")


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        pytest.param(
            "defaults: {scrape_interval: " + "9" * 400 + "}",
            "defaults.scrape_interval",
            "longer than ten years",
            id="huge-int-duration",
        ),
        pytest.param(
            "defaults: {scrape_interval: 99999999999d}",
            "defaults.scrape_interval",
            "longer than ten years",
            id="huge-duration",
        ),
        pytest.param(
            "defaults: {max_body_bytes: " + "9" * 400 + "GiB}", "defaults.max_body_bytes", "too large", id="huge-size"
        ),
        pytest.param("defaults: {scrape_interval: .nan}", "defaults.scrape_interval", "must be positive", id="nan"),
        pytest.param("listen: 2001-02-30", "line 1", "cannot read '2001-02-30' as timestamp", id="bad-date"),
        pytest.param("listen: 1\nstore: !!int 0xZZ", "line 2", "cannot read '0xZZ' as int", id="bad-int-tag"),
        # found by the config fuzzer: an empty !!float or !!int made PyYAML raise IndexError
        pytest.param("0: !!float", "line 1", "cannot read '' as float", id="empty-float-tag"),
        pytest.param("listen: 1\nstore: !!int", "line 2", "cannot read '' as int", id="empty-int-tag"),
        pytest.param("listen: 1\ngpu: \x1f", "line 2", "unacceptable character", id="control-char"),
        pytest.param("targets: " + "[" * 600, "line 1", "nested too deeply", id="nested-too-deeply"),
    ],
)
def test_values_that_crashed_the_loader_are_config_errors(text: str, key: str, reason: str) -> None:
    """Found by tests/reliability/test_fuzz.py: OverflowError, ValueError or RecursionError escaped parse_config,
    so `tuner run` printed a traceback instead of the key to fix."""
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    assert info.value.key == key and reason in info.value.reason, info.value


def test_a_prometheus_selector_is_parsed_into_matchers_and_a_bad_one_names_its_key() -> None:
    from tuner.config import Matcher, parse_selector

    ms = parse_selector('{job="vllm", instance=~"10\\\\.0\\\\.0\\\\.[0-9]+:8000",zone!="", tier!~"dev|test"}')
    assert ms == (
        Matcher("job", "=", "vllm"),
        Matcher("instance", "=~", "10\\.0\\.0\\.[0-9]+:8000"),
        Matcher("zone", "!=", ""),
        Matcher("tier", "!~", "dev|test"),
    )
    labels = {"job": "vllm", "instance": "10.0.0.7:8000", "zone": "a"}
    assert all(m(labels) for m in ms)
    assert not ms[1]({"instance": "10.0.0.7:80001"})  # anchored at both ends, as PromQL's regexes
    assert not ms[2]({"job": "vllm"})  # an absent label is "" (zone!="" wants one)
    assert not ms[3]({"tier": "dev"}) and ms[3]({})
    assert Matcher("x", "=", "")({}) and not Matcher("x", "=", "")({"x": "1"})
    for bad, why in (
        ("instance=host", 'expected label="value"'),
        ('x=~"("', "bad regex"),
        ("", "no label matchers"),
        ('a="1" b="2"', 'expected label="value"'),
    ):
        with pytest.raises(ValueError, match=why):
            parse_selector(bad)
    with pytest.raises(ConfigError, match=r"targets\[0\]\.prometheus_selector: .*bad regex"):
        parse_config(
            "prometheus: {url: 'http://127.0.0.1:9090'}\ntargets:\n  - {name: a, backend: vllm, "
            "url: 'http://h:1', source: prometheus, prometheus_selector: 'instance=~\"[\"'}\n"
        )


@pytest.mark.parametrize(("value", "seconds"), [("0s", 0.0), ("0", 0.0), ("0.0ms", 0.0), ("15s", 15.0), (30, 30.0)])
def test_health_interval_takes_a_duration_or_zero(value, seconds: float) -> None:
    t = parse_config(
        f"defaults: {{health_interval: {value}}}\n"
        f"targets:\n  - {{name: a, backend: vllm, url: 'http://h:1', health_interval: {value}}}\n"
    )
    assert t.defaults.health_interval.total_seconds() == seconds == t.health_interval(t.targets[0]).total_seconds()


@pytest.mark.parametrize("value", ["-1s", "soon", "true", ".nan"])
def test_a_bad_health_interval_names_its_key(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f"targets:\n  - {{name: a, backend: vllm, url: 'http://h:1', health_interval: {value}}}\n")
    assert info.value.key == "targets[0].health_interval", info.value


def test_a_target_without_health_interval_takes_the_default() -> None:
    cfg = parse_config("targets:\n  - {name: a, backend: vllm, url: 'http://h:1'}\n")
    assert cfg.health_interval(cfg.targets[0]).total_seconds() == 15.0


# ---- issue 39 items 12 and 13: names that end in a newline, silently dangerous values ---------------------------

_GROUP = (
    "targets:\n  - name: g\n    backend: vllm\n    url: http://127.0.0.1:8000\n"
    "    balancer: {socket: /run/haproxy.sock, backend: llm}\n"
    "    replicas:\n      - {name: r1, url: 'http://127.0.0.1:8001'}\n      - {name: r2, url: 'http://127.0.0.1:8002'}\n"
)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        pytest.param(
            'targets:\n  - {name: "chat\\n", backend: vllm, url: "http://127.0.0.1:8000"}\n',
            "targets[0].name",
            id="target-name",
        ),
        pytest.param(_GROUP.replace("name: r1", 'name: "r1\\n"'), "targets[0].replicas[0].name", id="replica-name"),
        pytest.param(
            _GROUP.replace("backend: llm", 'backend: "llm\\n"'), "targets[0].balancer.backend", id="balancer-backend"
        ),
        pytest.param(
            _GROUP.replace("backend: llm", 'backend: llm, frontend: "127.0.0.1:80\\n"'),
            "targets[0].balancer.frontend",
            id="balancer-frontend",
        ),
        pytest.param(
            _GROUP.replace("'http://127.0.0.1:8001'", '"http://127.0.0.1:8001\\n"'),
            "targets[0].replicas[0].url",
            id="replica-url",
        ),
        pytest.param(
            'targets:\n  - {name: chat, backend: vllm, url: "http://127.0.0.1:8000\\nX-Evil: 1"}\n',
            "targets[0].url",
            id="target-url",
        ),
        pytest.param(
            'alerting: {alertmanagers: ["http://127.0.0.1:9093\\n"]}\n', "alerting.alertmanagers", id="am-url"
        ),
    ],
)
def test_a_name_or_url_ending_in_a_newline_is_refused_by_key(text: str, key: str) -> None:
    """`$` matches before a final newline: "chat\\n" passed every name check and broke `tuner haproxy-config`."""
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    assert info.value.key == key, info.value


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        pytest.param("defaults: {scrape_interval: 1ms}\n", "defaults.scrape_interval", "shorter than 100ms", id="1ms"),
        pytest.param(
            "targets:\n  - {name: a, backend: vllm, url: 'http://127.0.0.1:8000', scrape_interval: 10ms}\n",
            "targets[0].scrape_interval",
            "shorter than 100ms",
            id="target-10ms",
        ),
        pytest.param(
            "alerting: {evaluation_interval: 50ms}\n",
            "alerting.evaluation_interval",
            "shorter than 100ms",
            id="evaluation-50ms",
        ),
        pytest.param("gpu: {source: nvml, interval: 1ms}\n", "gpu.interval", "shorter than 100ms", id="gpu-1ms"),
        pytest.param(
            "store: {retention: {raw: 30d, rollup: 7d}}\n", "store.retention", "raw (30 days", id="raw>rollup"
        ),
        pytest.param(
            "targets:\n  - {name: a, backend: vllm, url: 'http://127.0.0.1:8000', "
            "apply: {hook: {systemd_unit: '../../tmp/x'}}}\n",
            "targets[0].apply.hook.systemd_unit",
            "systemd service unit name",
            id="unit-path",
        ),
        pytest.param(
            "targets:\n  - {name: a, backend: vllm, url: 'http://127.0.0.1:8000', "
            "apply: {hook: {systemd_unit: '--now'}}}\n",
            "targets[0].apply.hook.systemd_unit",
            "systemd service unit name",
            id="unit-option",
        ),
        pytest.param(
            "targets:\n  - {name: a, backend: vllm, url: 'http://127.0.0.1:8000', "
            "apply: {hook: {systemd_unit: vllm}}}\n",
            "targets[0].apply.hook.systemd_unit",
            "such as vllm.service",
            id="unit-without-suffix",
        ),
    ],
)
def test_silently_dangerous_values_are_refused_by_key(text: str, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    assert info.value.key == key and says in info.value.reason, info.value


def test_sane_values_next_to_the_refused_ones_still_load() -> None:
    cfg = parse_config(
        "defaults: {scrape_interval: 100ms}\nstore: {retention: {raw: 7d, rollup: 7d}}\n"
        "targets:\n  - {name: a, backend: vllm, url: 'http://127.0.0.1:8000', "
        "apply: {hook: {systemd_unit: 'vllm@chat-1.service'}}}\n"
    )
    assert cfg.defaults.scrape_interval == timedelta(milliseconds=100)
    assert cfg.targets[0].apply.hook is not None and cfg.targets[0].apply.hook.systemd_unit == "vllm@chat-1.service"


@pytest.mark.parametrize(
    ("backend", "flags", "extra", "names"),
    [
        ("llamacpp", "{ctx_size: 2048}", "{'--ctx-size': 4096}", "ctx_size (-c)"),
        ("llamacpp", "{parallel: 2}", "{'-np': 4}", "parallel (--parallel)"),
        ("llamacpp", "{}", "{'--n-gpu-layers': 99}", "n_gpu_layers (-ngl)"),
        ("llamacpp", "{}", "{'--flash-attn': 'on'}", "flash_attn (-fa)"),
        ("vllm", "{}", "{'tp': 2}", "tensor_parallel_size (--tensor-parallel-size)"),
        ("vllm", "{}", "{'no-enable-prefix-caching': true}", "enable_prefix_caching (--enable-prefix-caching)"),
        ("vllm", "{}", "{max_num_seqs: 8}", "max_num_seqs (--max-num-seqs)"),
    ],
)
def test_extra_args_that_set_a_tunable_flag_in_any_spelling_are_refused(
    tmp_path: Path, backend: str, flags: str, extra: str, names: str
) -> None:
    """llama-server's long spellings (--ctx-size for -c) went into the argv beside tuner's own: the flag twice."""
    model = tmp_path / ("m.gguf" if backend == "llamacpp" else "model")
    with pytest.raises(ConfigError) as info:
        parse_config(
            f"targets:\n  - {{name: a, backend: {backend}, url: 'http://127.0.0.1:8000', "
            f"managed: {{model: '{model}', flags: {flags}, extra_args: {extra}}}}}\n",
            "c.yaml",
        )
    assert info.value.key.startswith("targets[0].managed.extra_args."), info.value
    assert f"sets the tunable flag {names}" in info.value.reason, info.value


@pytest.mark.parametrize(
    ("flags", "key", "says"),
    [
        ("{max-num-seqs: -1}", "flags.max-num-seqs", "-1 is outside 1..4096"),
        ("{gpu-memory-utilization: 1.5}", "flags.gpu-memory-utilization", "1.5 is outside 0.05..0.98"),
        ("{gpu_memory_utilization: .nan}", "flags.gpu_memory_utilization", "expected a finite number"),
        ("{max-num-seqs: 4, enable-prefix-caching: maybe}", "flags.enable-prefix-caching", "expected true or false"),
    ],
)
def test_a_plain_targets_known_flags_are_bounded_when_the_config_is_read(flags: str, key: str, says: str) -> None:
    """A target tuner does not start still names its flags in force; a value off the allow-list's bounds was
    accepted until a change was built from it (issue 39's probes: `tuner status` exited 0)."""
    with pytest.raises(ConfigError) as info:
        parse_config(f"targets:\n  - {{name: a, backend: vllm, url: 'http://127.0.0.1:8000', flags: {flags}}}\n")
    assert info.value.key == f"targets[0].{key}" and says in info.value.reason, info.value


def test_flags_tuner_does_not_know_are_the_servers_business() -> None:
    cfg = parse_config(
        "targets:\n  - {name: a, backend: vllm, url: 'http://127.0.0.1:8000', "
        "flags: {max-num-seqs: 8, served-model-name: chat, swap-space: -1}}\n"
    )
    assert cfg.targets[0].flags["max-num-seqs"] == 8 and cfg.targets[0].flags["swap-space"] == -1
