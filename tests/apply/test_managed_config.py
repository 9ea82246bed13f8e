"""Managed targets and apply hooks in the config, and the argv tuner builds from them: every bad value is refused
with the key that holds it, and nothing from the config can add an option to a server's command line."""

from __future__ import annotations

import pytest

from tuner.apply.managed import build_argv
from tuner.apply.routes import flags_argv, hook_argv
from tuner.config import parse_config
from tuner.errors import ConfigError


def target(tmp_path, managed: str = "", apply: str = "", backend: str = "vllm", url: str = "http://127.0.0.1:8000"):
    model = tmp_path / ("m.gguf" if backend == "llamacpp" else "model")
    if backend == "llamacpp":
        model.write_bytes(b"GGUF")
    else:
        model.mkdir(exist_ok=True)
    text = f"targets:\n  - name: t\n    backend: {backend}\n    url: {url}\n"
    if managed is not None:
        text += f"    managed: {{model: '{model}', executable: /opt/vllm/bin/python{managed}}}\n"
    if apply:
        text += f"    apply: {{{apply}}}\n"
    return parse_config(text).targets[0]


def test_vllm_argv_from_flags_and_extra_args(tmp_path):
    t = target(tmp_path, ", flags: {max_num_seqs: 8, enable_prefix_caching: false}, extra_args: {enforce-eager: true}")
    argv = build_argv(t, {"max_num_seqs": 8, "enable_prefix_caching": False})
    assert argv[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--port") + 1] == "8000" and argv[argv.index("--served-model-name") + 1] == "t"
    assert argv[argv.index("--shutdown-timeout") + 1] == "30"  # the drain
    assert "--enforce-eager" in argv and "--no-enable-prefix-caching" in argv
    assert argv[argv.index("--max-num-seqs") + 1] == "8"


def test_llamacpp_argv_always_has_metrics_and_embedding_when_asked(tmp_path):
    t = target(tmp_path, ", type: embedding, flags: {parallel: 4, ctx_size: 2048}", backend="llamacpp")
    argv = build_argv(t, {"parallel": 4, "ctx_size": 2048})
    assert "--metrics" in argv and "--embedding" in argv
    assert argv[argv.index("--parallel") + 1] == "4" and argv[argv.index("-c") + 1] == "2048"


def test_backend_auto_follows_the_model_file(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    cfg = parse_config(
        f"targets:\n  - {{name: a, backend: auto, url: 'http://127.0.0.1:8080', "
        f"managed: {{model: '{tmp_path / 'm.gguf'}'}}}}\n"
    )
    assert cfg.targets[0].backend == "llamacpp"
    with pytest.raises(ConfigError, match=r"targets\[0\]: backend auto needs managed.model"):
        parse_config("targets:\n  - {name: a, backend: auto, url: 'http://127.0.0.1:8080'}\n")


@pytest.mark.parametrize(
    "managed, key, reason",
    [
        (", flags: {max_num_seqs: 0}", "targets[0].managed.flags.max_num_seqs", "outside 1..4096"),
        (", flags: {max_num_seqs: '--api-key'}", "targets[0].managed.flags.max_num_seqs", "starts with '-'"),
        (
            ", flags: {trust_remote_code: true}",
            "targets[0].managed.flags.trust_remote_code",
            "not on tuner's allow-list",
        ),
        (", flags: {kv_cache_dtype: 'fp8 --x'}", "targets[0].managed.flags.kv_cache_dtype", "expected one of"),
        (", nice: 40", "targets[0].managed.nice", "less than or equal to 19"),
        (", typo: 1", "targets[0].managed.typo", "unknown key"),
    ],
)
def test_bad_managed_values_are_refused_with_their_key(tmp_path, managed, key, reason):
    with pytest.raises(ConfigError) as info:
        target(tmp_path, managed)
    assert info.value.key == key and reason in info.value.reason


def test_a_managed_url_needs_a_port(tmp_path):
    with pytest.raises(ConfigError, match="must be http://HOST:PORT"):
        target(tmp_path, url="http://127.0.0.1")


@pytest.mark.parametrize(
    "extra, reason",
    [
        ("{api-key: '--no-auth'}", "starts with '-'"),
        ("{'--model': other}", "expected a bare name"),
        ("{port: 9}", "set by the builder's own argument"),
    ],
)
def test_extra_args_cannot_smuggle_options(tmp_path, extra, reason):
    t = target(tmp_path, f", extra_args: {extra}")
    with pytest.raises(ConfigError) as info:
        build_argv(t, {})
    assert reason in str(info.value)


def test_extra_args_that_set_a_tunable_flag_are_refused_when_the_config_loads(tmp_path):
    """Not only at apply time: the config names the key (tests/test_config.py tries every spelling)."""
    with pytest.raises(ConfigError) as info:
        target(tmp_path, ", extra_args: {max-num-seqs: 8}")
    assert info.value.key == "targets[0].managed.extra_args.max-num-seqs"


def test_a_missing_model_is_named(tmp_path):
    t = target(tmp_path)
    (tmp_path / "model").rmdir()
    with pytest.raises(ConfigError, match="no such file or directory"):
        build_argv(t, {})


def test_hook_templates_expand_flags_as_separate_elements(tmp_path):
    t = target(
        tmp_path,
        managed=None,
        apply="hook: {command: [/usr/local/bin/restart, '--unit={target}', '{flags}', '--only', '{diff}']}",
    )
    argv = hook_argv(t, {"max_num_seqs": 8, "max_model_len": 4096}, {"max_num_seqs": 8}, 3)
    assert argv == [
        "/usr/local/bin/restart",
        "--unit=t",
        "--max-num-seqs",
        "8",
        "--max-model-len",
        "4096",
        "--only",
        "--max-num-seqs",
        "8",
    ]
    bad = target(tmp_path, managed=None, apply="hook: {command: [x, '{secret}']}")
    with pytest.raises(ConfigError, match="unknown placeholder"):
        hook_argv(bad, {}, {}, None)


def test_hook_needs_exactly_one_way(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of command"):
        target(tmp_path, managed=None, apply="hook: {command: [x], systemd_unit: vllm.service}")


def test_flags_argv_validates_every_value():
    assert flags_argv("llamacpp", {"parallel": 2, "flash_attn": "on"}) == ["--parallel", "2", "-fa", "on"]
    with pytest.raises(ValueError):
        flags_argv("llamacpp", {"parallel": "-1"})


def test_systemd_hook_writes_the_dropin_and_says_what_to_do_without_systemctl(tmp_path, monkeypatch, store):
    """No systemd on these machines: the drop-in is written, and a missing systemctl is a clear, failed apply."""
    import time

    from tuner.apply.flow import Applier
    from tuner.store import journal as jr
    from tuner.store import recommendations as recs

    dropin = tmp_path / "vllm.service.d" / "tuner-flags.conf"
    cfg = parse_config(
        "targets:\n  - name: t\n    backend: vllm\n    url: http://127.0.0.1:9\n"
        "    flags: {max-num-seqs: 4}\n"
        f"    apply: {{hook: {{systemd_unit: vllm.service, systemd_dropin: '{dropin}'}}}}\n"
    )
    monkeypatch.setenv("PATH", str(tmp_path))  # no systemctl on PATH, for certain
    ap = Applier(cfg, store, tmp_path, say=lambda m: None)
    rid = recs.add_recommendation(
        store.engine,
        target="t",
        now=time.time(),
        rules=["r"],
        diff_key="{}",
        diff={"max_num_seqs": 8},
        current={},
        evidence=[],
        expected_effect="",
        risk="",
        confidence=0.9,
        rank=1,
        memory_check={"ok": True},
    )
    a = ap.apply(rid)
    assert a.outcome == "failed" and "hook 'systemctl' not found; apply by hand" in a.note, a.note
    # restoring wrote the old flags back, so the unit would start as before
    assert dropin.read_text().endswith('[Service]\nEnvironment="TUNER_FLAGS=--max-num-seqs 4"\n')
    steps = [s["step"] for s in a.steps]
    assert steps.count("dropin") == 2 and "start_failed" in steps and "restore_failed" in steps
    assert recs.get_recommendation(store.engine, rid).status == "failed"
    assert jr.open_applies(store.engine) == []
