"""The allow-list: names per backend, types, bounds, no option injection, version/--help support."""

from __future__ import annotations

import pytest

from tuner.errors import FlagError
from tuner.flags import FLAGS, cli_name, help_flags, parse_version, render, supported, validate


@pytest.mark.parametrize(
    "backend,name,value,want",
    [
        ("vllm", "max_num_seqs", "8", 8),
        ("vllm", "--max-num-seqs", 8.0, 8),  # the server's spelling is accepted too
        ("vllm", "gpu_memory_utilization", "0.85", 0.85),
        ("vllm", "enable_prefix_caching", "true", True),
        ("vllm", "kv_cache_dtype", "fp8", "fp8"),
        ("llamacpp", "-c", 4096, 4096),
        ("llamacpp", "parallel", 4, 4),
        ("llamacpp", "flash_attn", "on", "on"),
    ],
)
def test_valid_values_come_back_typed(backend, name, value, want):
    got = validate(backend, name, value)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize(
    "backend,name,value,fragment",
    [
        ("vllm", "max_num_seqs", 0, "outside 1..4096"),
        ("vllm", "max_num_seqs", 2.5, "whole number"),
        ("vllm", "max_num_seqs", True, "expected a number"),
        ("vllm", "gpu_memory_utilization", 1.5, "outside 0.05..0.98"),
        ("vllm", "gpu_memory_utilization", "nan", "finite"),
        ("vllm", "kv_cache_dtype", "int4", "expected one of auto, fp8"),
        ("vllm", "kv_cache_dtype", "--trust-remote-code", "starts with '-'"),
        ("vllm", "max_model_len", "-1", "starts with '-'"),
        ("vllm", "trust_remote_code", True, "not on tuner's allow-list"),
        ("vllm", "ctx_size", 4096, "not on tuner's allow-list for vllm"),  # a llama-server flag
        ("llamacpp", "max_num_seqs", 4, "not on tuner's allow-list for llamacpp"),
        ("llamacpp", "n_gpu_layers", 1000, "outside 0..999"),
        ("sglang", "max_num_seqs", 4, "unknown backend"),
    ],
)
def test_bad_values_raise_a_flag_error_naming_flag_and_value(backend, name, value, fragment):
    with pytest.raises(FlagError) as err:
        validate(backend, name, value)
    assert fragment in str(err.value)
    assert err.value.exit_code == 2


def test_every_flag_is_declared_once_with_a_cli_spelling():
    names = [f.name for f in FLAGS]
    assert len(names) == len(set(names))
    assert cli_name("llamacpp", "ctx_size") == "-c" and cli_name("llamacpp", "ubatch_size") == "-ub"
    assert cli_name("llamacpp", "n_gpu_layers") == "-ngl" and cli_name("llamacpp", "batch_size") == "-b"
    assert cli_name("llamacpp", "flash_attn") == "-fa" and cli_name("vllm", "max_num_seqs") == "--max-num-seqs"


def test_render_gives_the_argv_builders_flag_maps():
    assert render("vllm", {"max_num_seqs": 16, "enable_prefix_caching": True}) == {
        "max-num-seqs": 16,
        "enable-prefix-caching": True,
    }
    assert render("llamacpp", {"parallel": 4, "ctx_size": 2048}) == {"--parallel": 4, "-c": 2048}
    with pytest.raises(FlagError):
        render("llamacpp", {"parallel": "-4"})


@pytest.mark.parametrize(
    "text,want",
    [
        ("0.32.0", (0, 32, 0)),
        ("v0.4.1", (0, 4, 1)),
        ("b6250-abc123", (6250,)),
        ("6300", (6300,)),
        ("b1-0c1e570", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_version(text, want):
    assert parse_version(text) == want


def test_support_by_version_and_help():
    assert supported("vllm", "max_num_seqs", None, None)[0]  # no minimum version
    ok, why = supported("vllm", "kv_cache_dtype", None, None)
    assert not ok and "unknown" in why  # never guess
    assert not supported("vllm", "kv_cache_dtype", (0, 3, 3), None)[0]
    assert supported("vllm", "kv_cache_dtype", (0, 32, 0), None)[0]
    # --help decides over the version; read from the real llama-server's help layout
    opts = help_flags(
        "-fa,   --flash-attn [on|off|auto]       set Flash Attention use\n"
        "-ub,   --ubatch-size N                  physical maximum batch size\n"
    )
    assert {"-fa", "--flash-attn", "-ub", "--ubatch-size"} <= opts
    assert supported("llamacpp", "flash_attn", None, opts)[0]
    assert not supported("llamacpp", "parallel", (9999,), opts)[0]
