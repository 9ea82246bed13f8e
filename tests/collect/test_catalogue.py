"""The metric catalogue, proved against recorded real expositions (vLLM 0.32 CPU build, llama-server)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import LLAMA_DIR, VLLM_DIR, sample_lines
from tuner.collect import vllm
from tuner.collect.catalogue import ALL_SPECS, LLAMACPP, VLLM, MetricSpec, lookup, spec

VLLM_FIXTURES = sorted(VLLM_DIR.glob("metrics_*.txt"))
LLAMA_FIXTURES = sorted(LLAMA_DIR.glob("metrics_*.txt"))

# Families the servers expose that tuner deliberately does not keep. A name missing from both the
# catalogue and this list fails test_every_served_family_is_catalogued_or_ignored: decide which.
IGNORED = {
    # model-FLOPs-utilization estimates: tuner reads GPU utilization from NVML / dcgm instead
    "vllm:estimated_flops_per_gpu_total",
    "vllm:estimated_read_bytes_per_gpu_total",
    "vllm:estimated_write_bytes_per_gpu_total",
    # KV-connector (LMCache, NIXL) prefix cache: no connector in the deployments tuner tunes
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
    # multimodal encoder cache: no multimodal flags in tuner's allow-list
    "vllm:mm_cache_queries_total",
    "vllm:mm_cache_hits_total",
    # per-source splits of prompt_tokens_total / prompt_tokens_cached_total, which tuner keeps
    "vllm:prompt_tokens_by_source_total",
    "vllm:prompt_tokens_cached_by_source_total",
    # sampling parameter n and KV-computed prefill tokens: no signal uses them yet
    "vllm:request_params_n",
    "vllm:request_prefill_kv_computed_tokens",
}
# prometheus_client adds a `<name>_created` gauge (creation time) beside every counter and histogram.
_CREATED = re.compile(r"_created$")


def _names(path: Path) -> set[str]:
    return {name for _, name, _, _ in sample_lines(path.read_text(encoding="utf-8"))}


def _families(path: Path) -> set[str]:
    """Metric family names served: histogram parts folded into their base, `_created` left out."""
    text = path.read_text(encoding="utf-8")
    histograms = set(re.findall(r"^# TYPE (\S+) histogram$", text, flags=re.M))
    out = set()
    for name in _names(path):
        if _CREATED.search(name):
            continue
        base = re.sub(r"_(bucket|count|sum)$", "", name)
        out.add(base if base in histograms else name)
    return out


def _wire_names(s: MetricSpec) -> set[str]:
    return {s.name + part for part in ("_bucket", "_count", "_sum")} if s.kind == "histogram" else {s.name}


def test_the_recorded_fixtures_are_there() -> None:
    expected_vllm = {
        "metrics_idle.txt",
        "metrics_under_load.txt",
        "metrics_after_load.txt",
        "metrics_prefix_caching_off.txt",
        "metrics_kv_pressure.txt",
    }
    expected_llama = {"metrics_idle.txt", "metrics_mid_load.txt", "metrics_after_load.txt"}
    assert expected_vllm <= {p.name for p in VLLM_FIXTURES}
    assert expected_llama <= {p.name for p in LLAMA_FIXTURES}


@pytest.mark.parametrize("path", VLLM_FIXTURES, ids=lambda p: p.stem)
def test_every_required_vllm_metric_is_served(path: Path) -> None:
    served = _names(path)
    required = [s for s in VLLM if s.required]
    missing = sorted(n for s in required for n in _wire_names(s) if n not in served)
    assert missing == [], f"{path.name} lacks required series"


@pytest.mark.parametrize("path", LLAMA_FIXTURES, ids=lambda p: p.stem)
def test_every_required_llamacpp_metric_is_served(path: Path) -> None:
    served = _names(path)
    missing = sorted(s.name for s in LLAMACPP if s.required and s.name not in served)
    assert missing == [], f"{path.name} lacks required series"


@pytest.mark.parametrize("path", VLLM_FIXTURES + LLAMA_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_served_family_is_catalogued_or_ignored(path: Path) -> None:
    ours = sorted(f for f in _families(path) if f.startswith(("vllm:", "llamacpp:")))
    assert ours, f"{path.name} has no vllm:/llamacpp: series at all"
    undecided = [f for f in ours if f not in IGNORED and not (lookup(f) or lookup(f + "_bucket"))]
    assert undecided == [], "new upstream series: add to the catalogue or to IGNORED (with a reason)"


def test_ignored_names_are_not_also_catalogued() -> None:
    catalogued = {n for s in ALL_SPECS for n in (s.name, *s.aliases)}
    assert sorted(IGNORED & catalogued) == []


def test_catalogue_names_are_unique_and_spec_finds_each() -> None:
    names = [n for s in ALL_SPECS for n in (s.name, *s.aliases)]
    assert len(names) == len(set(names))
    for s in ALL_SPECS:
        assert spec(s.name) is s
    with pytest.raises(KeyError, match="not in tuner's metric catalogue"):
        spec("vllm:no_such_metric")


def test_lookup_names_the_part_of_each_wire_name() -> None:
    ttft = spec("vllm:time_to_first_token_seconds")
    assert lookup("vllm:time_to_first_token_seconds_bucket") == (ttft, "bucket")
    assert lookup("vllm:time_to_first_token_seconds_count") == (ttft, "count")
    assert lookup("vllm:time_to_first_token_seconds_sum") == (ttft, "sum")
    assert lookup("vllm:time_to_first_token_seconds") is None  # a histogram has no plain sample
    assert lookup("ray_vllm_num_requests_running") == (spec("vllm:num_requests_running"), "value")
    assert lookup("python_gc_objects_collected_total") is None


# ---- aliases: an older or Ray-prefixed server reads the same ---------------------------------------

_OLD_NAMES = [  # (current name, the name older vLLM served)
    ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ("vllm:prefix_cache_queries_", "vllm:gpu_prefix_cache_queries_"),
    ("vllm:prefix_cache_hits_", "vllm:gpu_prefix_cache_hits_"),
    ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
]


def _to_old_names(text: str, prefix: str) -> str:
    for new, old in _OLD_NAMES:
        # (?<![\w:]) keeps e.g. vllm:external_prefix_cache_hits_total as it is
        text = re.sub(rf"(?<![\w:]){re.escape(new)}", old, text)
    return re.sub(r"(?<![\w:])vllm:", prefix, text)


@pytest.mark.parametrize("prefix", ["ray_vllm:", "ray_vllm_"])
@pytest.mark.parametrize("path", VLLM_FIXTURES, ids=lambda p: p.stem)
def test_old_and_ray_prefixed_names_give_the_same_snapshot(path: Path, prefix: str) -> None:
    text = path.read_text(encoding="utf-8")
    old = _to_old_names(text, prefix)
    for new, was in _OLD_NAMES:  # the rewrite really happened
        assert new in text and new not in old and prefix + was.removeprefix("vllm:") in old
    assert not re.search(r"(?m)^vllm:", old)

    current = vllm.snapshot_from_text(text, target="t", ts=0.0)
    renamed = vllm.snapshot_from_text(old, target="t", ts=0.0)

    assert [e.as_json() for e in renamed.engines] == [e.as_json() for e in current.engines]
    assert [e.histograms for e in renamed.engines] == [e.histograms for e in current.engines]
    assert renamed.engines == current.engines  # every value, histogram and config label
    assert renamed.engines[0].histogram("vllm:inter_token_latency_seconds") is not None
