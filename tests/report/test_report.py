"""``tuner report``: a store filled from recorded real vLLM expositions (through tuner's own parser and
``Store.ingest``), alert events, and applies written through the apply journal; the HTML opened in headless
Chromium, its screenshot checked for drawn plots and its DOM for the plots' paths, markers and table rows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from html import unescape
from pathlib import Path

import pytest

from tests.helpers import fixture_text, migrated_store
from tuner.cli import main
from tuner.collect import vllm
from tuner.lab.replay import ReplayExposition
from tuner.report.html import plot_titles
from tuner.store import journal
from tuner.store import tuning as tj
from tuner.store.alerts import record_events

T0 = 1_790_000_000.0  # a fixed start; scrapes 5 s apart
STEP = 5.0


def fill(store) -> None:  # type: ignore[no-untyped-def]
    """One recorded server's expositions in their recorded order: 10 scrapes idle, 5 under load (8 running,
    16 waiting), then 25 of the after-load one replayed with counters and histograms growing 4 % a scrape."""
    idle = fixture_text("vllm-0.32-cpu/metrics_idle.txt")
    load = fixture_text("vllm-0.32-cpu/metrics_under_load.txt")
    after = ReplayExposition(fixture_text("vllm-0.32-cpu/metrics_after_load.txt"), growth=0.04)
    for i in range(40):
        text = idle if i < 10 else load if i < 15 else after.render().decode()
        store.ingest(vllm.snapshot_from_text(text, target="chat", ts=T0 + i * STEP), url="http://127.0.0.1:8000")
    ms = lambda t: int(t * 1000)  # noqa: E731
    labels = {"alertname": "QueueDepthHigh", "target": "chat", "severity": "warning"}
    record_events(
        store,
        [
            {
                "ts_ms": ms(T0 + 60),
                "rule": "QueueDepthHigh",
                "fingerprint": "f1",
                "labels": json.dumps(labels),
                "from_state": "inactive",
                "to_state": "pending",
                "value": 16.0,
            },
            {
                "ts_ms": ms(T0 + 90),
                "rule": "QueueDepthHigh",
                "fingerprint": "f1",
                "labels": json.dumps(labels),
                "from_state": "pending",
                "to_state": "firing",
                "value": 16.0,
            },
            {
                "ts_ms": ms(T0 + 90),
                "rule": "TargetDown",
                "fingerprint": "f2",
                "labels": json.dumps({"alertname": "TargetDown", "target": "other"}),
                "from_state": "pending",
                "to_state": "firing",
                "value": 0.0,
            },  # another target: not in chat's report
        ],
    )
    kpis = {
        "offered_rps": 2.0,
        "capacity_rps": 2.1,
        "slo_goodput_rps": 1.9,
        "slo_attainment": 0.91,
        "ttft_p99": 0.8,
        "e2e_p99": 12.0,
        "capacity_tokens_per_s": 130.0,
        "saturated": False,
    }
    for at, outcome, after in (
        (T0 + 120, "rolled_back", {**kpis, "ttft_p99": 1.6, "slo_attainment": 0.7}),
        (T0 + 160, "kept", {**kpis, "ttft_p99": 0.4, "slo_attainment": 0.98}),
    ):
        aid = journal.begin_apply(
            store.engine,
            target="chat",
            recommendation_id=None,
            kind="apply",
            mode="manual",
            now=at,
            diff={"max-num-seqs": 16},
            old_flags={"max-num-seqs": 8},
            new_flags={"max-num-seqs": 16},
            old_argv=[],
            new_argv=[],
            owner_pid=os.getpid(),
            owner_start=0,
        )
        journal.set_kpis(store.engine, aid, now=at + 1, baseline=kpis)
        journal.step(store.engine, aid, "observing", now=at + 5, state="observing")
        journal.set_kpis(store.engine, aid, now=at + 25, after=after)
        journal.finish(store.engine, aid, outcome, f"P99 TTFT {kpis['ttft_p99']} -> {after['ttft_p99']}", now=at + 25)
    # A tuning run: 2 and 8 sequences are on the capacity/latency front, 16 is dominated by 8 (less capacity,
    # more latency), 64 crashed, 256 was pruned by the memory model.
    run = tj.begin_run(
        store.engine,
        target="chat",
        now=T0 + 170,
        request={},
        workload={"input_len": 128},
        slo={"e2e_p99": 4.0},
        baseline_flags={"max_num_seqs": 2},
    )
    for seqs, status, cap, e2e in (
        (2, "measured", 2.0, 1.0),
        (8, "measured", 4.0, 1.5),
        (16, "measured", 3.0, 2.0),
        (64, "crashed", 0.0, None),
        (256, "pruned", 0.0, None),
    ):
        tid = tj.begin_trial(
            store.engine,
            run,
            now=T0 + 171,
            flags={"max_num_seqs": seqs},
            seed="",
            url="u",
            status="running" if status != "pruned" else "pruned",
        )
        tj.finish_trial(
            store.engine,
            tid,
            now=T0 + 180,
            status=status,
            capacity_rps=cap,
            detail={"e2e_p99": e2e, "ttft_p99": e2e and e2e / 2, "note": f"trial {seqs}"},
        )
    tj.finish_run(
        store.engine,
        run,
        now=T0 + 181,
        state="done",
        result={"best": {"flags": {"max_num_seqs": 8}, "capacity_rps": 4.0}, "verdict": "max_num_seqs=8"},
    )
    # The tuning run held the target in the apply journal (kind tune, beside production): no apply, not in the
    # report's applies (the demo's report once drew a before/after view and a 'rolled_back' mark for it).
    hold = journal.begin_apply(
        store.engine,
        target="chat",
        recommendation_id=None,
        kind="tune",
        mode="shadow",
        now=T0 + 170,
        diff={},
        old_flags={"max_num_seqs": 2},
        new_flags={"max_num_seqs": 2},
        old_argv=[],
        new_argv=[],
        owner_pid=os.getpid(),
        owner_start=0,
    )
    journal.finish(store.engine, hold, "unchanged", "tuning run (done); production was not touched", now=T0 + 181)


@pytest.fixture
def report(tmp_path: Path, capsys) -> tuple[Path, str]:  # type: ignore[no-untyped-def]
    store = migrated_store(tmp_path)
    fill(store)
    store.engine.dispose()
    cfg = tmp_path / "tuner.yaml"
    cfg.write_text(
        "store: {url: 'sqlite:///tuner.db'}\ntargets:\n"
        "  - {name: chat, backend: vllm, url: 'http://127.0.0.1:8000', slo: {ttft_p99: 1s}}\n"
    )
    out = tmp_path / "report.html"
    assert (
        main(
            [
                "--config",
                str(cfg),
                "report",
                "--target",
                "chat",
                "--since",
                "200s",
                "--until",
                str(T0 + 200),
                "--points",
                "80",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    return out, capsys.readouterr().out


def chromium() -> str:
    path = shutil.which("chromium")
    if path:
        return path
    if os.environ.get("TUNER_REQUIRE_REAL_SERVERS") == "1":
        pytest.fail("chromium not installed; run scripts/install-chromium.sh")
    pytest.skip("chromium not installed; run scripts/install-chromium.sh")


def run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--hide-scrollbars",
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def png_pixels(data: bytes) -> tuple[int, int, list[tuple[int, ...]]]:
    """Decode a non-interlaced 8-bit RGB/RGBA PNG (what Chromium writes) without Pillow."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos : pos + 4]), data[pos + 4 : pos + 8]
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw, stride, prev, pixels = zlib.decompress(idat), width * bpp, bytearray(width * bpp), []
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        pixels.extend(tuple(line[i : i + 3]) for i in range(0, stride, bpp))
        prev = line
    return width, height, pixels


# ---- reading the page ------------------------------------------------------------------------------------------


def figures(html: str) -> list[tuple[str, str, dict]]:
    """(css class, title, plotly figure) of every chart, as the page carries them (plotly's JSON)."""
    return [
        (m.group(1), unescape(m.group(2)), json.loads(m.group(3)))
        for m in re.finditer(
            r'<div class="(plot[^"]*)" data-plot="([^"]*)"><script type="application/json" class="figure">(.*?)</script>',
            html,
            flags=re.S,
        )
    ]


def drawn(dom: str) -> list[tuple[str, str, float, list[list[float]]]]:
    """What the browser drew, per chart: (css class, title, plot-area width, the x coordinates of each drawn line,
    relative to the plot area; markers-only traces draw none), from Chromium's DOM after plotly.js ran."""
    out = []
    for m in re.finditer(
        r'<div class="(plot[^"]*)" data-plot="([^"]*)">(.*?)(?=<div class="plot[ "]|<h[234]|<table|'
        r"<footer|</section)",
        dom,
        flags=re.S,
    ):
        chart = m.group(3).split('<g class="infolayer">')[0]  # not the legend's sample lines
        bg = re.search(r'<rect class="bg" x="[\d.]+" y="[\d.]+" width="([\d.]+)"', chart)
        lines = [
            [
                float(x)
                for d in re.findall(r'<path class="js-line" d="([^"]+)"', trace)
                for x in re.findall(r"[ML](-?[\d.]+),", d)
            ]  # a line with gaps is drawn as several paths
            for trace in chart.split('<g class="trace scatter')[1:]
        ]
        out.append((m.group(1), unescape(m.group(2)), float(bg.group(1)) if bg else 0.0, [xs for xs in lines if xs]))
    return out


def series_points(fig: dict) -> dict[str, int]:
    """legend -> values drawn (not gaps) of the chart's data lines (markers excluded)."""
    return {t["name"]: sum(v is not None for v in t["y"]) for t in fig["data"] if t.get("meta") == "series"}


def shapes(fig: dict, kind: str) -> list[dict]:
    return [s for s in fig["layout"].get("shapes", []) if s.get("name") == kind]


# ---- tests ---------------------------------------------------------------------------------------------------


def test_report_is_one_self_contained_file_with_plots_markers_and_tables(report):
    from tuner.report.html import plotly_js

    out, printed = report
    full = out.read_text()
    # Nothing to fetch: the one library script is the installed plotly's own bundle, and nothing else links out.
    lib = re.search(r'<script type="text/javascript" class="plotly-js">(.*?)</script>', full, flags=re.S)
    assert lib is not None and lib.group(1) == plotly_js() and len(lib.group(1)) > 1_000_000
    page = full.replace(lib.group(0), "")
    assert re.search(r"\b(src|href)=|url\(|<link|@import|https?://", page) is None
    assert "1 target(s), 5 plots, 2 alert events, 2 applies" in printed
    figs = figures(full)
    main = {title: fig for cls, title, fig in figs if cls == "plot"}
    assert sorted(main) == sorted(plot_titles())
    # Latency and throughput have data once the load starts (the first 10 scrapes are idle).
    legends = {legend: n for fig in main.values() for legend, n in series_points(fig).items()}
    for legend in ("P50", "P99", "prompt", "generated", "KV use", "running (peak)", "waiting (peak)"):
        assert legends.get(legend, 0) >= 40, (legend, legends)
    # QueueDepthHigh firing, once per plot (not the other target's TargetDown); two applies, one rolled back
    for fig in main.values():
        assert len(shapes(fig, "alert")) == 1 and len(shapes(fig, "apply")) == 2 and len(shapes(fig, "rollback")) == 1
        hover = [t["text"] for t in fig["data"] if t.get("meta") == "marker alert"]
        assert hover == [["QueueDepthHigh inactive -> firing"]] or hover == [["QueueDepthHigh pending -> firing"]]
    assert "TargetDown" not in page
    assert len(re.findall(r'<tr class="kpi" data-apply="\d+" data-kpi=', page)) == 14  # 7 KPIs x 2 applies
    assert "+100.0%" in page and "-50.0%" in page  # TTFT P99 0.8 s -> 1.6 s (rolled back), -> 0.4 s (kept)
    # Each apply's own view: E2E, queue and throughput from a baseline (5 min, the default) before it to 30 s after
    # it, its start marked; the data (scrapes from T0 to T0 + 195 s) fills the part of the span it covers.
    views = [(title, fig) for cls, title, fig in figs if cls == "plot apply-view"]
    assert sorted(re.sub(r" \(engine 0\)$", "", t) for t, _ in views) == sorted(
        f"apply #{i}: {t}"
        for i in (1, 2)
        for t in ("End-to-end latency", "Requests running / waiting", "Tokens per second")
    )
    for title, fig in views:
        assert shapes(fig, "apply"), title
        assert max(series_points(fig).values()) >= 10, (title, series_points(fig))
    # The tuning page: one scatter of the measured trials, the front joined, every trial in the table
    scatters = [fig for cls, _, fig in figs if cls == "plot scatter"]
    assert len(scatters) == 1
    by_meta = {t["meta"]: t for t in scatters[0]["data"]}
    assert by_meta["front"]["text"] == ["max_num_seqs=2", "max_num_seqs=8"]  # left to right: less latency first
    assert by_meta["front"]["y"] == [2.0, 4.0] and by_meta["trial"]["text"] == ["max_num_seqs=16"]
    rows = re.findall(r'<tr class="trial-row" data-status="(\w+)"><td>\d+</td><td>max_num_seqs=(\d+)</td>', page)
    assert rows == [("measured", "8"), ("measured", "16"), ("measured", "2"), ("crashed", "64"), ("pruned", "256")]


def test_chromium_renders_the_plots(report, tmp_path):
    out, _ = report
    shot = tmp_path / "shot.png"
    r = run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1000,1400", out.as_uri())
    assert shot.exists(), r.stderr[-2000:]
    width, height, pixels = png_pixels(shot.read_bytes())
    assert (width, height) == (1000, 1400)
    non_white = sum(1 for p in pixels if p != (255, 255, 255))
    colours = {p for p in pixels}
    line_blue = sum(1 for p in pixels if p == (0x1F, 0x77, 0xB4))  # the first series' stroke
    line_red = sum(1 for p in pixels if p == (0xD6, 0x27, 0x28))
    assert non_white > 0.05 * width * height, non_white
    assert len(colours) > 50, len(colours)
    assert line_blue > 500 and line_red > 300, (line_blue, line_red)

    dom = run_chromium(tmp_path, "--dump-dom", out.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    charts = drawn(dom.stdout)
    assert [c[0] for c in charts].count("plot") == 5 and [c[0] for c in charts].count("plot apply-view") == 6
    assert [c[0] for c in charts].count("plot scatter") == 1
    assert all(c[2] > 500 for c in charts), [(c[1], c[2]) for c in charts]  # every chart drew its plot area
    assert sum(len(c[3]) for c in charts if c[0] == "plot") == 9  # 2+2+1+2+2 lines drawn
    assert len(re.findall(r'<tr class="kpi"', dom.stdout)) == 14
    assert len(re.findall(r'<tr class="alert-event"', dom.stdout)) == 2
    assert dom.stdout.count('<tr class="trial-row"') == 5


def test_png_reader_sees_a_blank_page_as_blank(tmp_path):
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body style='background:#fff'></body></html>")
    shot = tmp_path / "blank.png"
    run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=400,300", blank.as_uri())
    _, _, pixels = png_pixels(shot.read_bytes())
    assert {p for p in pixels} == {(255, 255, 255)}


def test_unknown_target_and_bad_output_are_one_line_errors(tmp_path, capsys):
    store = migrated_store(tmp_path)
    fill(store)
    store.engine.dispose()
    cfg = tmp_path / "tuner.yaml"
    cfg.write_text("store: {url: 'sqlite:///tuner.db'}\ntargets:\n  - {name: chat, backend: vllm, url: 'http://x:1'}\n")
    assert main(["--config", str(cfg), "report", "--target", "nope", "-o", str(tmp_path / "r.html")]) == 2
    assert "unknown target 'nope'; known targets: chat" in capsys.readouterr().err
    assert main(["--config", str(cfg), "report", "-o", str(tmp_path / "missing-dir" / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "missing-dir/r.html: -o: give a file path in an existing directory" in err and err.count("\n") == 1


def test_a_short_run_fills_the_plots_under_the_default_24_hours(tmp_path, capsys):
    """Issue 16: the demo's few minutes of data were a sliver at the right edge of 24-hour plots. The report's
    range is the stored data within the period asked: every series starts near the left edge and ends near the
    right one (3 minutes and 15 s of scrapes, asked for the 24 hours up to an hour after them), in the figure's data
    and in what Chromium drew."""
    store = migrated_store(tmp_path)
    fill(store)  # 40 scrapes, 5 s apart, from T0
    store.engine.dispose()
    cfg = tmp_path / "tuner.yaml"
    cfg.write_text("store: {url: 'sqlite:///tuner.db'}\ntargets:\n  - {name: chat, backend: vllm, url: 'http://x:1'}\n")
    out = tmp_path / "r.html"
    assert main(["--config", str(cfg), "report", "--until", str(T0 + 3600), "-o", str(out)]) == 0
    gauges = {"KV-cache use (peak in window)", "Requests running / waiting"}
    # gauges have a value at every scrape (latency quantiles only once requests finish, after the idle start)
    for cls, title, fig in figures(out.read_text()):
        if cls != "plot" or title not in gauges:
            continue
        lo, hi = fig["layout"]["xaxis"]["range"]
        for trace in (t for t in fig["data"] if t.get("meta") == "series"):
            xs = [x for x, y in zip(trace["x"], trace["y"]) if y is not None]
            assert len(xs) >= 10, (title, trace["name"], len(xs))
            # from the first stored scrape to the last: most of the width (windows need a few scrapes to fill)
            assert (min(xs) - lo) < 0.25 * (hi - lo) and (hi - max(xs)) < 0.05 * (hi - lo), (title, lo, hi, xs)
        gauges.discard(title)
    assert not gauges, f"no chart for {gauges}"
    if shutil.which("chromium") is None:
        return
    dom = run_chromium(tmp_path, "--dump-dom", out.as_uri()).stdout
    spans = [
        (title, (max(xs) - min(xs)) / width) for cls, title, width, lines in drawn(dom) if cls == "plot" for xs in lines
    ]
    assert spans and all(
        s > 0.7 for t, s in spans if t in ("KV-cache use (peak in window)", "Requests running / waiting")
    ), spans


def test_pareto_front_of_capacity_against_latency():
    from tuner.report.figures import pareto

    # (capacity, P99): (4, 1.5) beats (3, 2.0) on both; (2, 1.0) has the least latency; (4, 1.6) loses to (4, 1.5)
    assert pareto([(2.0, 1.0), (4.0, 1.5), (3.0, 2.0), (4.0, 1.6)]) == [True, True, False, False]
    assert pareto([]) == [] and pareto([(1.0, 1.0), (1.0, 1.0)]) == [True, True]  # ties both stay
