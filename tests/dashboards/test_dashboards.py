"""The dashboards: committed JSON is what the code generates; every query parses in the real promtool and reads
only metric names that a recorded real exposition (tests/fixtures/) or tuner's own exporter serves.

tuner's exporter output here is what TunerCollector declares (``# TYPE`` lines and samples) after a Daemon
scraped replayed fixtures of vLLM and llama-server and read the dcgm-exporter fixture as its GPU source;
tests/integration/test_dashboards_real.py then proves every query returns data from a real Prometheus.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.conftest import ROOT, require_tool
from tests.helpers import FIXTURES, fixture_text
from tuner.config import parse_config
from tuner.daemon import Daemon
from tuner.daemon.metrics import TunerCollector
from tuner.dashboards import build_dashboards, metric_names, queries, substitute, to_json
from tuner.dashboards.build import PENDING_SERIES
from tuner.lab.replay import ReplayExposition, ReplayServer

DASHBOARDS = ROOT / "dashboards"
_NAME = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{|\s)")


def exposition_names(text: str) -> set[str]:
    """Sample names of an exposition, plus the families its ``# TYPE`` lines declare."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#") and (m := _NAME.match(line)):
            names.add(m.group(1))
    return names


def fixture_names() -> set[str]:
    return set().union(*(exposition_names(p.read_text()) for p in FIXTURES.glob("*/*.txt")))


def exporter_names(store) -> set[str]:  # type: ignore[no-untyped-def]
    vllm = ReplayServer(ReplayExposition(fixture_text("vllm-0.32-cpu/metrics_under_load.txt"), growth=0.05))
    llama = ReplayServer(ReplayExposition(fixture_text("llama-server/metrics_mid_load.txt"), growth=0.05))
    dcgm = ReplayServer(ReplayExposition(fixture_text("dcgm-exporter/metrics_2gpus.txt"), growth=0.0))
    with vllm, llama, dcgm:
        cfg = parse_config(
            f"gpu: {{source: dcgm, url: '{dcgm.url}/metrics'}}\ntargets:\n"
            f"  - {{name: v, backend: vllm, url: '{vllm.url}'}}\n"
            f"  - {{name: l, backend: llamacpp, url: '{llama.url}'}}\n"
        )
        daemon = Daemon(cfg, store)
        for _ in range(3):
            for t in cfg.targets:
                daemon.scraping.scrape_once(t)
            time.sleep(0.2)
        daemon.signals_once()
        daemon.gpu_once()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TunerCollector(daemon.state))
    return exposition_names(generate_latest(registry).decode())


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict]:
    return build_dashboards()


@pytest.fixture(scope="module")
def known_names(tmp_path_factory) -> set[str]:  # type: ignore[no-untyped-def]
    from tests.helpers import migrated_store

    store = migrated_store(tmp_path_factory.mktemp("exporter"))
    try:
        return fixture_names() | exporter_names(store)
    finally:
        store.engine.dispose()


def unknown_names(dashboards: dict[str, dict], known: set[str]) -> list[str]:
    return [
        f"{q.dashboard} / {q.where}: {name}"
        for d in dashboards.values()
        for q in queries(d)
        for name in sorted(metric_names(q.expr))
        if name not in known
    ]


def promtool_errors(exprs: list[str], tmp: Path) -> list[str]:
    """Expressions promtool rejects, each with its message (one rules file, then one file per culprit)."""
    promtool = require_tool("promtool")

    def check(batch: list[str], name: str) -> subprocess.CompletedProcess[str]:
        rules = {
            "groups": [
                {
                    "name": "dashboards",
                    "rules": [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(batch)],
                }
            ]
        }
        path = tmp / name
        path.write_text(json.dumps(rules))  # JSON is YAML
        return subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)

    if check(exprs, "all.yml").returncode == 0:
        return []
    bad = []
    for i, e in enumerate(exprs):
        r = check([e], f"q{i}.yml")
        if r.returncode != 0:
            bad.append(f"{e!r}: {(r.stderr or r.stdout).strip().splitlines()[-1]}")
    assert bad, "promtool rejected the batch but no single expression"
    return bad


# ---- the tests -----------------------------------------------------------------------------------------


def test_committed_json_is_what_the_code_generates(dashboards):
    files = {p.stem: p for p in DASHBOARDS.glob("*.json")}
    assert sorted(files) == sorted(dashboards), "run `tuner dashboards generate` and commit dashboards/"
    for uid, model in dashboards.items():
        assert files[uid].read_text() == to_json(model), f"{files[uid]} is stale: run `tuner dashboards generate`"


def test_four_dashboards_with_variables_panels_and_annotations(dashboards):
    assert set(dashboards) == {"tuner-vllm", "tuner-gpu", "tuner-llama-server", "tuner-self"}
    for uid, d in dashboards.items():
        variables = {v["name"]: v for v in d["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        panels = [p for p in d["panels"] if p["type"] != "row"]
        assert all(p["datasource"]["uid"] == "${datasource}" for p in panels), uid
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)), f"{uid}: duplicate panel ids"
        cells = set()  # no two panels overlap on the 24-column grid
        for p in d["panels"]:
            g = p["gridPos"]
            assert g["x"] + g["w"] <= 24, (uid, p["title"])
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not cells & mine, f"{uid}: {p['title']} overlaps another panel"
            cells |= mine
    assert {"target", "model"} <= {v["name"] for v in dashboards["tuner-vllm"]["templating"]["list"]}
    exprs = " ".join(q.expr for q in queries(dashboards["tuner-vllm"]))
    for histogram in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        for q in ("0.5", "0.95", "0.99"):
            assert f"histogram_quantile({q}, sum by (target, model_name, le) (rate(vllm:{histogram}_bucket" in exprs
    notes = {a["name"] for a in dashboards["tuner-self"]["annotations"]["list"]}
    assert {"Applies kept", "Rollbacks", "Alerts firing"} <= notes


def test_every_query_parses_in_promtool(dashboards, tmp_path):
    exprs = [substitute(q.expr) for d in dashboards.values() for q in queries(d)]
    assert len(exprs) > 60
    assert promtool_errors(exprs, tmp_path) == []


def test_promtool_check_catches_a_broken_query(tmp_path):
    errors = promtool_errors(["up", 'sum by (target (rate(vllm:num_requests_running{target=~".*"}[30s]))'], tmp_path)
    assert len(errors) == 1 and "sum by (target (rate" in errors[0]


def test_every_metric_name_is_served_by_a_real_server_or_tuner(dashboards, known_names):
    assert unknown_names(dashboards, known_names | PENDING_SERIES) == []


def test_pending_exporter_series_are_still_pending(dashboards, known_names):
    """Fails once tuner's exporter serves them: then empty PENDING_SERIES so they are checked like the rest."""
    served = PENDING_SERIES & known_names
    assert not served, f"tuner's exporter now serves {sorted(served)}: remove them from PENDING_SERIES"
    used = {n for d in dashboards.values() for q in queries(d) for n in metric_names(q.expr)}
    assert {
        "vllm:kv_cache_usage_perc",
        "llamacpp:requests_deferred",
        "DCGM_FI_DEV_GPU_UTIL",
        "tuner_gpu_utilization_ratio",
        "tuner_alerts",
        "tuner_scrape_duration_seconds",
    } <= used


def test_name_check_catches_a_name_no_real_exposition_has(dashboards, known_names):
    known_names = known_names | PENDING_SERIES
    # vLLM 0.32 renamed gpu_cache_usage_perc to kv_cache_usage_perc: a dashboard on the old name shows nothing.
    assert "vllm:gpu_cache_usage_perc" not in known_names
    d = json.loads(
        json.dumps(dashboards["tuner-vllm"]).replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    )
    missing = unknown_names({"tuner-vllm": d}, known_names)
    assert missing == ["tuner-vllm / KV-cache use [A]: vllm:gpu_cache_usage_perc"]
    d = json.loads(json.dumps(dashboards["tuner-gpu"]).replace("tuner_gpu_power_watts", "tuner_gpu_power_w"))
    assert unknown_names({"tuner-gpu": d}, known_names) == ["tuner-gpu / Power [A]: tuner_gpu_power_w"]


@pytest.mark.parametrize(
    "expr, names",
    [
        (
            "histogram_quantile(0.99, sum by (target, model_name, le) (rate(vllm:e2e_request_latency_seconds_bucket"
            '{target=~".*",model_name=~"a|b"}[30s])))',
            {"vllm:e2e_request_latency_seconds_bucket"},
        ),
        ("sum(rate(a_total[5m])) / ignoring(le) sum without (x) (b) > bool 0 or vector(0)", {"a_total", "b"}),
        (
            'count by (alertname, alertstate) (tuner_alerts{alertstate="firing",summary="rate(x) by (y)"}) offset 5m',
            {"tuner_alerts"},
        ),
        (
            "DCGM_FI_DEV_FB_USED + on(gpu) group_left(modelName) DCGM_FI_DEV_FB_FREE",
            {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"},
        ),
        ("max_over_time(up[1h:1m]) * 1e3", {"up"}),
    ],
)
def test_metric_names_of_an_expression(expr, names):
    assert metric_names(expr) == names


def test_substitute_replaces_grafana_variables_and_names_an_unknown_one():
    assert substitute('x{target=~"$target"}[$__rate_interval] ${model}') == 'x{target=~".*"}[30s] .*'
    with pytest.raises(KeyError, match=r"\$instance"):
        substitute('up{instance="$instance"}')
