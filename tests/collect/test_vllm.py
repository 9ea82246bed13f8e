"""vLLM collector: recorded /metrics → EngineSnapshots whose every field equals the fixture's line."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests.helpers import LLAMA_DIR, VLLM_DIR, Route, bucket_counts, sample_lines, series_values, serve, value_of
from tuner.collect import vllm
from tuner.collect.catalogue import VLLM
from tuner.collect.snapshots import EngineSnapshot
from tuner.errors import ScrapeError

VLLM_FIXTURES = sorted(VLLM_DIR.glob("metrics_*.txt"))
HISTOGRAMS = [s.name for s in VLLM if s.kind == "histogram"]
CONFIG_KEYS = [
    "block_size",
    "num_gpu_blocks",
    "kv_cache_size_tokens",
    "kv_cache_max_concurrency",
    "gpu_memory_utilization",
    "enable_prefix_caching",
]


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _one_engine(text: str) -> EngineSnapshot:
    snap = vllm.snapshot_from_text(text, target="gpu-box", ts=1_700_000_000.0)
    assert len(snap.engines) == 1
    return snap.engines[0]


def _sum(text: str, name: str, **labels: str) -> float:
    found = series_values(text, name, **labels)
    assert found, f"no {name} line"
    return math.fsum(v for _, v in found)


def _config_labels(text: str, engine: str = "0") -> dict[str, str]:
    ((labels, _),) = series_values(text, "vllm:cache_config_info", engine=engine)
    return labels


@pytest.mark.parametrize("path", VLLM_FIXTURES, ids=lambda p: p.stem)
def test_contract_fields_equal_the_fixture_lines(path: Path) -> None:
    text = _text(path)
    e = _one_engine(text)
    ((labels, _),) = series_values(text, "vllm:num_requests_running")
    assert (e.engine, e.model_name) == (labels["engine"], labels["model_name"])

    assert e.kv_cache_usage == value_of(text, "vllm:kv_cache_usage_perc")
    assert e.requests_running == value_of(text, "vllm:num_requests_running")
    assert e.requests_waiting == value_of(text, "vllm:num_requests_waiting")
    got = e.as_json()
    assert (got["backend"], got["engine"], got["model_name"]) == ("vllm", e.engine, e.model_name)
    for field, metric in [
        ("preemptions_total", "vllm:num_preemptions_total"),
        ("prompt_tokens_total", "vllm:prompt_tokens_total"),
        ("generation_tokens_total", "vllm:generation_tokens_total"),
        ("prefix_cache_hits_total", "vllm:prefix_cache_hits_total"),
        ("prefix_cache_queries_total", "vllm:prefix_cache_queries_total"),
        ("process_start_time_seconds", "process_start_time_seconds"),
        # summed over finished_reason (stop, length, abort, ...)
        ("requests_finished_total", "vllm:request_success_total"),
    ]:
        assert got[field] == _sum(text, metric), field


@pytest.mark.parametrize("path", VLLM_FIXTURES, ids=lambda p: p.stem)
def test_every_catalogue_field_served_is_in_the_json(path: Path) -> None:
    text = _text(path)
    got = _one_engine(text).as_json()
    served = {name for _, name, _, _ in sample_lines(text)}
    fields = {s.field: s.name for s in VLLM if s.field}
    assert {f for f, m in fields.items() if m in served} == set(got) - {"backend", "engine", "model_name", "config"}
    for f, m in fields.items():
        if m in served:
            assert got[f] == _sum(text, m), f


@pytest.mark.parametrize("path", VLLM_FIXTURES, ids=lambda p: p.stem)
def test_engine_config_comes_from_cache_config_info(path: Path) -> None:
    text = _text(path)
    e = _one_engine(text)
    labels = _config_labels(text)
    for key in CONFIG_KEYS:
        assert e.config[key] == labels[key], key
    assert e.as_json()["config"] == {k: v for k, v in labels.items() if k != "engine"}


def test_prefix_caching_off_fixture_says_so() -> None:
    off = _one_engine(_text(VLLM_DIR / "metrics_prefix_caching_off.txt"))
    on = _one_engine(_text(VLLM_DIR / "metrics_after_load.txt"))
    assert off.config["enable_prefix_caching"] == "False"
    assert on.config["enable_prefix_caching"] == "True"


def test_under_load_fixture_has_running_requests() -> None:
    text = _text(VLLM_DIR / "metrics_under_load.txt")
    e = _one_engine(text)
    assert e.requests_running is not None and e.requests_running > 0
    assert e.requests_running == value_of(text, "vllm:num_requests_running")


def test_kv_pressure_fixture_has_preemptions() -> None:
    text = _text(VLLM_DIR / "metrics_kv_pressure.txt")
    got = _one_engine(text).as_json()
    assert got["preemptions_total"] > 0
    assert got["preemptions_total"] == value_of(text, "vllm:num_preemptions_total")


@pytest.mark.parametrize("path", VLLM_FIXTURES, ids=lambda p: p.stem)
def test_histograms_equal_the_bucket_lines(path: Path) -> None:
    text = _text(path)
    e = _one_engine(text)
    checked = 0
    for name in HISTOGRAMS:
        buckets = bucket_counts(text, name)
        h = e.histogram(name)
        if not buckets:
            assert h is None
            continue
        assert h is not None, name
        assert list(h.bounds) == sorted(h.bounds) and len(set(h.bounds)) == len(h.bounds)
        assert h.bounds[-1] == math.inf
        assert dict(zip(h.bounds, h.counts)) == buckets
        assert h.count == value_of(text, name + "_count")
        assert h.sum == value_of(text, name + "_sum")
        checked += 1
    assert checked >= 10  # vLLM serves a dozen latency and size histograms


# ---- several engines and models behind one endpoint ------------------------------------------------

SECOND = ("1", "second-model")


def _other(value: float) -> float:
    return value * 3 + 1  # different from the original, and keeps bucket counts cumulative


def _with_second_engine(text: str, model: str) -> str:
    """Duplicate every engine-0 line as engine 1 serving SECOND's model, with other values."""
    out = []
    for line in text.split("\n"):
        out.append(line)
        if line.startswith("#") or 'engine="0"' not in line:
            continue
        series, value = line.rsplit(" ", 1)
        series = series.replace('engine="0"', f'engine="{SECOND[0]}"')
        if f'model_name="{model}"' in series:
            series = series.replace(f'model_name="{model}"', f'model_name="{SECOND[1]}"')
            out.append(f"{series} {_other(float(value))!r}")
        else:  # cache_config_info: engine label only; give engine 1 twice the blocks
            out.append(
                re.sub(r'num_gpu_blocks="(\d+)"', lambda m: f'num_gpu_blocks="{int(m[1]) * 2}"', series) + f" {value}"
            )
    return "\n".join(out)


def test_each_engine_and_model_gets_its_own_values_and_config() -> None:
    text = _text(VLLM_DIR / "metrics_under_load.txt")
    single = _one_engine(text)
    two = _with_second_engine(text, single.model_name)

    snap = vllm.snapshot_from_text(two, target="gpu-box", ts=0.0)
    first, second = snap.engines
    assert (first.engine, first.model_name) == ("0", single.model_name)
    assert (second.engine, second.model_name) == SECOND
    # engine 0 reads exactly as before
    assert first.values == single.values
    assert first.histograms == single.histograms
    assert first.config == single.config

    # engine 1's values are its own lines
    lbl = {"engine": SECOND[0], "model_name": SECOND[1]}
    assert second.kv_cache_usage == value_of(two, "vllm:kv_cache_usage_perc", **lbl)
    assert second.requests_running == value_of(two, "vllm:num_requests_running", **lbl)
    assert second.requests_running == _other(value_of(text, "vllm:num_requests_running"))
    assert second.as_json()["prompt_tokens_total"] == value_of(two, "vllm:prompt_tokens_total", **lbl)
    ttft = second.histogram("vllm:time_to_first_token_seconds")
    assert ttft is not None
    assert dict(zip(ttft.bounds, ttft.counts)) == bucket_counts(two, "vllm:time_to_first_token_seconds", **lbl)

    # cache_config_info has only an engine label: each engine gets its own
    assert second.config["num_gpu_blocks"] == _config_labels(two, engine="1")["num_gpu_blocks"]
    assert int(second.config["num_gpu_blocks"]) == 2 * int(first.config["num_gpu_blocks"])
    # process_start_time_seconds has neither label: both engines share it
    assert second.as_json()["process_start_time_seconds"] == value_of(text, "process_start_time_seconds")
    # admission_rejections_total names only the first model: it stays with that engine
    assert first.total("vllm:admission_rejections_total") == _sum(text, "vllm:admission_rejections_total")
    assert second.total("vllm:admission_rejections_total") is None


# ---- the wrong server ---------------------------------------------------------------------------------


def test_a_llama_server_exposition_is_not_vllm() -> None:
    text = _text(LLAMA_DIR / "metrics_mid_load.txt")
    with pytest.raises(ScrapeError, match=r"has no vllm:\* series"):
        vllm.snapshot_from_text(text, target="laptop", ts=0.0)


def test_an_empty_exposition_is_not_vllm() -> None:
    with pytest.raises(ScrapeError, match=r"has no vllm:\* series"):
        vllm.snapshot_from_text("", target="gpu-box", ts=0.0)


# ---- scrape() over real HTTP ----------------------------------------------------------------------------


def test_scrape_reads_metrics_and_health_from_a_server() -> None:
    body = (VLLM_DIR / "metrics_under_load.txt").read_bytes()
    routes = {"/metrics": Route(body=body), "/health": Route(body=b"")}
    with serve(routes) as url:
        snap = vllm.scrape(url, target="gpu-box", timeout_s=5, max_bytes=len(body), now=1_700_000_000.0)
    assert (snap.target, snap.backend, snap.ts, snap.healthy) == ("gpu-box", "vllm", 1_700_000_000.0, True)
    assert snap.body_bytes == len(body)
    assert snap.engines[0].requests_running == value_of(body.decode(), "vllm:num_requests_running")
    assert routes["/metrics"].hits == routes["/health"].hits == 1


def test_a_scrape_told_not_to_ask_health_makes_one_request() -> None:
    body = (VLLM_DIR / "metrics_under_load.txt").read_bytes()
    routes = {"/metrics": Route(body=body), "/health": Route(body=b"")}
    with serve(routes) as url:
        snap = vllm.scrape(url, target="gpu-box", timeout_s=5, max_bytes=len(body), health=False)
    assert snap.healthy is None and snap.engines
    assert (routes["/metrics"].hits, routes["/health"].hits) == (1, 0)


def test_scrape_with_unhealthy_health_endpoint_still_returns_metrics() -> None:
    body = (VLLM_DIR / "metrics_idle.txt").read_bytes()
    with serve({"/metrics": Route(body=body), "/health": Route(status=503)}) as url:
        snap = vllm.scrape(url, target="gpu-box", timeout_s=5, max_bytes=len(body))
    assert snap.healthy is False
    assert len(snap.engines) == 1


def test_a_bucket_whose_le_is_not_a_number_is_dropped_as_a_problem() -> None:
    """Found by tests/reliability/test_fuzz.py: ``le="NaN1.0"`` raised a bare ValueError from the assembler, which
    the daemon records as an internal error (target down). Now the bucket is dropped and named."""
    text = (VLLM_DIR / "metrics_after_load.txt").read_text(encoding="utf-8")
    line = next(x for x in text.split("\n") if x.startswith("vllm:time_to_first_token_seconds_bucket{"))
    bad = text.replace(line, line.replace('le="', 'le="NaN1.0', 1), 1)
    snap = vllm.snapshot_from_text(bad, target="t", ts=0.0)
    line_no = bad.split("\n").index(line.replace('le="', 'le="NaN1.0', 1)) + 1
    assert f"line {line_no}: vllm:time_to_first_token_seconds_bucket has le='NaN1.0" in "; ".join(snap.problems)
    good = vllm.snapshot_from_text(text, target="t", ts=0.0)
    assert len(snap.engines[0].histograms) == len(good.engines[0].histograms)  # the other buckets still make one
