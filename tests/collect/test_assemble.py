"""Assembly of samples into engines (collect/assemble.py): linear in the samples, the same engines as the quadratic
walk it replaced (kept here as the reference), and a cap on engines per target that fails the scrape (issue 39,
item 9). The timings at 2k and 32k engines are bench/many_engines.py's, not asserted here."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
from sqlalchemy import text

from tests.helpers import Route, fixture_text, serve
from tuner.collect import assemble
from tuner.collect.assemble import MAX_ENGINES, _extra, _histogram, _le, assemble_engines
from tuner.collect.exposition import parse_exposition
from tuner.collect.snapshots import EngineSnapshot
from tuner.config import parse_config
from tuner.daemon import Daemon
from tuner.errors import ExpositionError


def reference(samples, backend, default_model, problems):
    """assemble_engines as it was before issue 39: every sample matched against every engine (O(N^2))."""
    samples = list(samples)
    engines = (
        {
            (s.labels["engine"], s.labels["model_name"])
            for s in samples
            if "engine" in s.labels and "model_name" in s.labels
        }
        or {
            (s.labels.get("engine", "0"), s.labels.get("model_name", default_model))
            for s in samples
            if "engine" in s.labels or "model_name" in s.labels
        }
        or {("0", default_model)}
    )

    def owners(labels):
        e, m = labels.get("engine"), labels.get("model_name")
        return [k for k in engines if (e is None or k[0] == e) and (m is None or k[1] == m)]

    values, config = defaultdict(dict), defaultdict(dict)
    parts = defaultdict(lambda: defaultdict(lambda: {"buckets": {}}))
    for s in samples:
        for owner in owners(s.labels):
            key = (s.spec.name, _extra(s.labels))
            if s.spec.kind == "info":
                config[owner].update({k: v for k, v in s.labels.items() if k not in assemble._IGNORED_LABELS})
            elif s.part == "value":
                values[owner][key] = s.value
            elif s.part == "bucket":
                if "le" not in s.labels or _le(s.labels["le"]) is None:
                    continue
                parts[owner][key]["buckets"][_le(s.labels["le"])] = s.value
            else:
                parts[owner][key][s.part] = s.value
    out = []
    for owner in sorted(engines):
        hists = {k: h for k, p in parts[owner].items() if (h := _histogram(k[0], p, problems)) is not None}
        out.append(
            EngineSnapshot(
                backend=backend,
                engine=owner[0],
                model_name=owner[1],
                values=dict(values[owner]),
                histograms=hists,
                config=dict(config[owner]),
            )
        )
    return tuple(out)


def _body(rng: random.Random) -> str:
    """A recorded vLLM exposition whose labelled lines are spread over random engines and models, some lines
    losing one of the two labels (they then belong to every engine that matches the other)."""
    engines = [str(i) for i in range(rng.randint(1, 3))]
    models = [f"m{i}" for i in range(rng.randint(1, 4))]
    out = []
    for line in fixture_text("vllm-0.32-cpu/metrics_after_load.txt").splitlines():
        if 'engine="0"' in line and 'model_name="' in line and not line.startswith("#"):
            head, _, rest = line.partition("{")
            labels = [p for p in rest.split("}")[0].split(",") if not p.startswith(("engine=", "model_name="))]
            tail = line.rsplit("}", 1)[1]
            for e in engines:
                for m in models:
                    keep = [f'engine="{e}"', f'model_name="{m}"'][: 2 if rng.random() > 0.1 else 1]
                    if rng.random() < 0.05:
                        keep = keep[1:]
                    out.append(f"{head}{{{','.join(keep + labels)}}}{tail}")
        else:
            out.append(line)
    # a duplicate series (one label dropped above) is a parse error: keep the first of each
    seen, lines = set(), []
    for line in out:
        key = line.rsplit(" ", 1)[0]
        if line.startswith("#") or key not in seen:
            seen.add(key)
            lines.append(line)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", range(12))
def test_the_same_engines_as_the_quadratic_walk(seed: int) -> None:
    parsed = parse_exposition(_body(random.Random(seed)))
    samples = [s for s in parsed.samples if s.spec.backend == "vllm"]
    mine, theirs = [], []
    assert assemble_engines(samples, "vllm", "d", mine) == reference(samples, "vllm", "d", theirs)
    assert mine == theirs


def _engines_body(n: int) -> str:
    return "# TYPE vllm:num_requests_running gauge\n" + "".join(
        f'vllm:num_requests_running{{engine="0",model_name="m{i}"}} 1\n' for i in range(n)
    )


def test_more_engines_than_the_cap_is_an_exposition_error() -> None:
    ok = [s for s in parse_exposition(_engines_body(MAX_ENGINES)).samples]
    assert len(assemble_engines(ok, "vllm", "d", [])) == MAX_ENGINES
    over = [s for s in parse_exposition(_engines_body(MAX_ENGINES + 1)).samples]
    with pytest.raises(ExpositionError, match=f"{MAX_ENGINES + 1} engines .* over tuner's cap of {MAX_ENGINES}"):
        assemble_engines(over, "vllm", "d", [])


def test_a_target_over_the_cap_is_a_failed_scrape_and_the_daemon_goes_on(tmp_path, store) -> None:
    """A real server whose body names 5,000 models: the scrape is recorded as failed (down, the cap named), no
    series is stored for it, and the next target is scraped as usual."""
    with (
        serve({"/metrics": Route(body=_engines_body(5000)), "/health": Route(body=b"")}) as bad,
        serve(
            {"/metrics": Route(body=fixture_text("vllm-0.32-cpu/metrics_after_load.txt")), "/health": Route(body=b"")}
        ) as good,
    ):
        cfg = parse_config(
            f"store: {{url: 'sqlite:///{tmp_path}/t.db'}}\ntargets:\n"
            f"  - {{name: many, backend: vllm, url: '{bad}'}}\n"
            f"  - {{name: good, backend: vllm, url: '{good}'}}\n"
        )
        daemon = Daemon(cfg, store)
        assert [daemon.scraping.scrape_once(t) for t in cfg.targets] == [False, True]
    h = store.health("many")
    assert h is not None and h.health == "down" and f"cap of {MAX_ENGINES}" in h.last_error
    with store.engine.connect() as conn:
        assert (
            conn.execute(
                text("SELECT COUNT(*) FROM series s JOIN targets t ON t.id = s.target_id WHERE t.name = 'many'")
            ).scalar()
            == 0
        )
