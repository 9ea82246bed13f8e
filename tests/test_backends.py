"""Every backend in tuner/backends.py against what its real server exports and accepts (recorded fixtures)."""

from __future__ import annotations

import pytest

from tests.helpers import fixture_text, sample_lines
from tuner.apply.launch import llama_server_argv, vllm_argv
from tuner.backends import BACKENDS, Backend, backend, kv_block_size
from tuner.collect import catalogue
from tuner.collect.scrape import READERS, snapshot_from_text
from tuner.flags import FLAGS, parse_version, render, takes

# One loaded exposition of each backend's real server (tests/fixtures/README.md says how they were recorded).
LOADED = {"vllm": "vllm-0.32-cpu/metrics_under_load.txt", "llamacpp": "llama-server/metrics_mid_load.txt"}
# What each real server says its version is, and the argv builder its managed servers start with.
VERSIONS = {"vllm": ("0.32.0", "0.32.0"), "llamacpp": ("b6250-0c1e570", "build 6250")}
ARGV = {
    "vllm": lambda flags: vllm_argv("python", "/m", port=8000, flags=flags),
    "llamacpp": lambda flags: llama_server_argv("llama-server", "/m.gguf", port=8000, flags=flags),
}
EVERY = pytest.mark.parametrize("b", list(BACKENDS.values()), ids=list(BACKENDS))


def test_the_registry_covers_what_collect_and_the_tests_know():
    assert set(BACKENDS) == set(READERS) == set(LOADED) == set(VERSIONS) == set(ARGV)
    assert backend("vllm").title == "vLLM"
    with pytest.raises(ValueError, match="unknown backend 'tgi'; known: vllm, llamacpp"):
        backend("tgi")


@EVERY
def test_its_load_metrics_are_catalogued_and_served_by_the_real_server(b: Backend):
    served = {name for _line, name, _labels, _value in sample_lines(fixture_text(LOADED[b.name]))}
    for role, name in b.load_metrics.items():
        spec = catalogue.spec(name)
        assert spec.backend == b.name, (role, name)
        wire = {name, f"{name}_bucket", f"{name}_count", *spec.aliases}
        assert served & wire, f"{b.name}: {role} = {name} is not in {LOADED[b.name]}"
    # counting requests means a request counter and the latency histograms the verdict reads
    has_requests = {"finished", "ttft", "e2e", "queue"} <= set(b.load_metrics)
    assert b.counts_requests == has_requests
    assert b.capacity_unit == ("req/s" if has_requests else "tokens/s")
    assert {"generated", "running", "waiting"} <= set(b.load_metrics)


@EVERY
def test_a_recorded_exposition_reads_back_as_its_backend(b: Backend):
    snap = snapshot_from_text(b.name, fixture_text(LOADED[b.name]), target="t", ts=1.0, model_name="m")
    assert snap.backend == b.name and snap.engines
    running = sum(e.requests_running or 0.0 for e in snap.engines)
    assert running > 0  # recorded under load: the role "running" is wired to a real series


@EVERY
def test_its_flags_render_the_way_its_server_spells_them(b: Backend):
    flags = {
        f.name: (
            f.choices[0]
            if f.kind == "choice"
            else True
            if f.kind == "bool"
            else int(f.minimum or 1)
            if f.kind == "int"
            else 0.5
        )
        for f in FLAGS
        if takes(b.name, f.name) and f.name != "backend"
    }
    assert flags, b.name
    rendered = render(b.name, flags)
    assert all(key.startswith("-") == b.dashed_flags for key in rendered), rendered
    argv = ARGV[b.name](rendered)
    for f in FLAGS:
        if f.name in flags:
            assert f.cli[b.name] in argv, (f.name, argv)


@EVERY
def test_its_version_reads_and_prints_as_its_server_writes_it(b: Backend):
    raw, shown = VERSIONS[b.name]
    version = parse_version(raw)
    assert version is not None and b.version_text(version) == shown


@pytest.mark.parametrize(
    "config,size",
    [
        ({"block_size": "128"}, 128),
        ({"block_size": 16}, 16),
        ({"block_size": "0"}, None),
        ({"block_size": "None"}, None),
        ({"block_size": "-16"}, None),
        ({}, None),
    ],
)
def test_the_kv_block_size_is_read_where_the_server_says_it(config, size):
    """One reader for the three places that need it: the prefix bound of `tuner workload`, the memory breakdown and
    the advisor's memory plan (which takes vLLM's GPU default, 16, where it is None)."""
    assert kv_block_size(config) == size
