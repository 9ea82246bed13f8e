"""Fuzzing the four inputs tuner reads from outside: expositions, llama-server /slots and /health, rule files, config.

Each surface gets at least ``EXAMPLES`` generated inputs (``TUNER_FUZZ_EXAMPLES``; 3,000 in the suite, 10,000 from
bench/reliability.py --fuzz): near-valid ones (recorded real expositions and
/slots from tests/fixtures/ with a few mutations; rule and config documents, a third of them valid, the rest
with wrong types, unknown keys and odd YAML, also mutated as text) and raw bytes / text (a half of the
exposition inputs, two thirds of the /slots ones, a quarter of the rule and config ones). The property is the same everywhere: the input parses, or it
raises one of tuner's typed errors (TunerError) whose message names the line or the key. Anything else
(a TypeError, an OverflowError, a RecursionError...) is a crash the daemon would log as an internal error.

Reproducible: ``derandomize=True`` and no example database, so CI runs the same inputs every time. Each
test counts the inputs its body actually ran and fails if the count drops under ``EXAMPLES``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import LLAMA_DIR, VLLM_DIR, Route, serve
from tuner.collect import llamacpp, vllm
from tuner.collect.exposition import decode_body
from tuner.collect.snapshots import TargetSnapshot
from tuner.config import Config, parse_config
from tuner.errors import ConfigError, ExpositionError, RuleFileError, ScrapeError
from tuner.rules.model import RuleSet, parse_rules

# The suite runs 3,000 per surface (the same inputs every run); bench/reliability.py --fuzz runs 10,000.
EXAMPLES = int(os.environ.get("TUNER_FUZZ_EXAMPLES", "3000"))  # each path (parsed, refused) takes >= 5% of them
ROOT = Path(__file__).resolve().parents[2]

# Reported by the tests (and bench/reliability.py): inputs run per surface, and how they ended.
RESULTS: dict[str, dict[str, float]] = {}


def _fuzz(surface: str, strategy: st.SearchStrategy, check: Callable[[Any], str], examples: int = EXAMPLES) -> dict:
    """Run ``check`` on ``examples`` generated inputs; return {outcome: count, "inputs": n, "seconds": s}."""
    outcomes: dict[str, float] = {"inputs": 0}

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(value: Any) -> None:
        outcome = check(value)
        outcomes["inputs"] += 1
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    start = time.monotonic()
    run()
    outcomes["seconds"] = round(time.monotonic() - start, 1)
    RESULTS[surface] = outcomes
    assert outcomes["inputs"] >= examples, f"{surface}: only {outcomes['inputs']} inputs ran, want {examples}"
    return outcomes


# ---- mutations of real text ---------------------------------------------------------------------------------

_TOKENS = [
    "NaN",
    "+Inf",
    "-Inf",
    "-0",
    "1e400",
    "9" * 400,
    "0x1f",
    "",
    " ",
    "1_000",
    "\x00",
    "\u00e9",
    '"',
    "\\",
    "\\n",
    '\\"',
    "{",
    "}",
    "=",
    ",",
    "#",
    "\r",
    "\t",
    "\n",
    "# TYPE ",
    "# HELP ",
    " counter",
    " histogram",
    " summary",
    " gauge",
    "_total",
    "_bucket",
    "_count",
    "_sum",
    'le="+Inf"',
    'le="0.5"',
    'engine="1"',
    'model_name="m"',
    "vllm:",
    "llamacpp:",
    "\u2028",
    "\ufeff",
    "1700000000000",
    " 1 2 3",
]


@st.composite
def _mutated(draw: st.DrawFn, texts: list[str], *, window: int = 60) -> str:
    """A real text, often cut to a window of lines, with up to five edits of the kind a broken server makes."""
    lines = draw(st.sampled_from(texts)).split("\n")
    if draw(st.integers(0, 9)):  # a window keeps each input small; one in ten is the whole recording
        start = draw(st.integers(0, len(lines) - 1))
        lines = lines[start : start + draw(st.integers(1, window))]
    for _ in range(draw(st.integers(0, 5))):
        i = draw(st.integers(0, max(0, len(lines) - 1)))
        line = lines[i] if lines else ""
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "char", "token", "cut", "value", "text"]))
        if op == "delete" and lines:
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, line)
        elif op == "swap" and len(lines) > 1:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op in ("char", "token", "text"):
            pos = draw(st.integers(0, len(line)))
            new = (
                draw(st.characters())
                if op == "char"
                else draw(st.sampled_from(_TOKENS))
                if op == "token"
                else draw(st.text(max_size=12))
            )
            width = draw(st.integers(0, 2))
            lines[i : i + 1] = [line[:pos] + new + line[pos + width :]]
        elif op == "cut":
            lines[i : i + 1] = [line[: draw(st.integers(0, len(line)))]]
        elif op == "value" and " " in line:
            lines[i : i + 1] = [line.rsplit(" ", 1)[0] + " " + draw(st.sampled_from(_TOKENS))]
    return "\n".join(lines)


def _bytes_of(texts: st.SearchStrategy[str]) -> st.SearchStrategy[bytes]:
    """The text's UTF-8, sometimes with one byte replaced (invalid UTF-8 in the middle of a body)."""

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        body = draw(texts).encode("utf-8")
        if body and draw(st.booleans()):
            pos = draw(st.integers(0, len(body) - 1))
            body = body[:pos] + bytes([draw(st.integers(0x80, 0xFF))]) + body[pos + 1 :]
        return body

    return build()


# ---- 1. exposition -> snapshot (vLLM and llama-server) ---------------------------------------------------------

_EXPOSITIONS = {
    "vllm": [p.read_text(encoding="utf-8") for p in sorted(VLLM_DIR.glob("metrics_*.txt"))],
    "llamacpp": [p.read_text(encoding="utf-8") for p in sorted(LLAMA_DIR.glob("metrics_*.txt"))],
}


def _exposition_case() -> st.SearchStrategy[tuple[str, bytes]]:
    near = st.sampled_from(sorted(_EXPOSITIONS)).flatmap(
        lambda b: st.tuples(st.just(b), _bytes_of(_mutated(_EXPOSITIONS[b])))
    )
    raw = st.tuples(
        st.sampled_from(sorted(_EXPOSITIONS)), st.one_of(st.binary(max_size=300), _bytes_of(st.text(max_size=300)))
    )
    return st.one_of(near, raw)


def _check_exposition(case: tuple[str, bytes]) -> str:
    backend, body = case
    lines = body.split(b"\n")
    try:
        text = decode_body(body)
        module = vllm if backend == "vllm" else llamacpp
        snap = module.snapshot_from_text(text, target="fuzz", ts=1.0)
    except ExpositionError as exc:
        assert exc.line_no is not None and 1 <= exc.line_no <= len(lines), exc
        assert str(exc).startswith(f"line {exc.line_no}: "), exc
        return "ExpositionError"
    except ScrapeError as exc:  # parsed, but none of the backend's series: says which backend is missing
        assert "fuzz: /metrics has no" in str(exc), exc
        return "ScrapeError"
    assert isinstance(snap, TargetSnapshot) and snap.engines
    for e in snap.engines:
        assert all(v == v and abs(v) != float("inf") for v in e.values.values()), "non-finite value kept"
    return "parsed"


def test_fuzz_exposition() -> None:
    out = _fuzz("exposition", _exposition_case(), _check_exposition)
    assert out.get("parsed", 0) >= EXAMPLES // 20 and out.get("ExpositionError", 0) >= EXAMPLES // 20, (
        out
    )  # both paths exercised


# ---- 2. llama-server /slots and /health --------------------------------------------------------------------------

_SLOTS = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(LLAMA_DIR.glob("slots_*.json"))]
_JSON_ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**300, max_value=10**310),
    st.floats(),
    st.text(max_size=8),
    st.just([]),
    st.just({}),
    st.just([{"n_decoded": "x"}]),
    st.just("[" * 5000),
).map(copy.deepcopy)  # fresh objects: mutations must not alias


@st.composite
def _mutated_slots(draw: st.DrawFn) -> bytes:
    """A recorded /slots with a few fields set to wrong types, removed, or renamed."""
    slots = json.loads(json.dumps(draw(st.sampled_from(_SLOTS))))
    for _ in range(draw(st.integers(0, 4))):
        if not slots:
            break
        slot = slots[draw(st.integers(0, len(slots) - 1))]
        if not isinstance(slot, dict):
            continue
        op = draw(st.sampled_from(["set", "delete", "busy", "next_token", "slot", "drop"]))
        keys = [
            "n_ctx",
            "is_processing",
            "n_prompt_tokens",
            "n_prompt_tokens_processed",
            "n_prompt_tokens_cache",
            "next_token",
            "id",
        ]
        if op == "set":
            slot[draw(st.sampled_from(keys))] = draw(_JSON_ODD)
        elif op == "delete":
            slot.pop(draw(st.sampled_from(keys)), None)
        elif op == "busy":
            slot["is_processing"] = True
        elif op == "next_token":
            slot["next_token"] = [{"n_decoded": draw(_JSON_ODD)}] if draw(st.booleans()) else draw(_JSON_ODD)
        elif op == "slot":
            slots[draw(st.integers(0, len(slots) - 1))] = draw(_JSON_ODD)
        else:
            slots.pop()
    text = json.dumps(slots)
    if draw(st.booleans()):  # sometimes the body itself is cut or edited
        text = draw(_mutated([text], window=1))
    return text.encode("utf-8", "surrogatepass")


def _check_slots(body: bytes) -> str:
    try:
        slots = llamacpp.parse_slots(body)
    except ExpositionError as exc:
        assert str(exc).startswith("/slots"), exc  # names the field: /slots[2].n_ctx, /slots is not JSON, ...
        return "ExpositionError"
    assert 0 <= slots.slots_busy <= slots.slots_total and slots.slot_context_tokens > 0
    assert 0 <= slots.kv_tokens_in_use <= slots.slots_busy * slots.slot_context_tokens
    return "parsed"


def test_fuzz_slots() -> None:
    out = _fuzz(
        "slots",
        st.one_of(
            _mutated_slots(),
            st.binary(max_size=200),
            st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
        ),
        _check_slots,
    )
    assert out.get("parsed", 0) >= EXAMPLES // 20 and out.get("ExpositionError", 0) >= EXAMPLES // 20, out


_METRICS_OK = (LLAMA_DIR / "metrics_mid_load.txt").read_bytes()
_HEALTH_BODIES = st.one_of(
    st.just(b'{"status":"ok"}'), st.just(b'{"error":{"code":503,"message":"Loading model"}}'), st.binary(max_size=64)
)


def test_fuzz_health_and_slots_over_http() -> None:
    """The whole llama-server scrape over real HTTP: any /health status and body, any /slots answer.

    /health 503 is "still loading" (ScrapeError); any other status still reads /metrics; a bad /slots never
    fails the scrape (it becomes a problem on the snapshot, and KV use is left out).
    """
    routes = {"/health": Route(), "/metrics": Route(body=_METRICS_OK), "/slots": Route()}
    case = st.tuples(
        st.sampled_from([200, 200, 200, 404, 500, 503]),
        _HEALTH_BODIES,
        st.sampled_from([200, 200, 200, 501, 503]),
        st.one_of(_mutated_slots(), st.binary(max_size=100)),
    )
    with serve(routes) as url:

        def check(c: tuple[int, bytes, int, bytes]) -> str:
            routes["/health"].status, routes["/health"].body, routes["/slots"].status, routes["/slots"].body = c
            try:
                snap = llamacpp.scrape(url, target="fuzz", timeout_s=5, max_bytes=2**20)
            except ScrapeError as exc:
                assert c[0] == 503 and "still loading" in str(exc), exc
                return "loading"
            assert snap.healthy is (c[0] == 200)
            assert (snap.slots is None) == any(p.startswith("/slots") for p in snap.problems)
            return "scraped" if snap.slots is not None else "scraped-without-slots"

        out = _fuzz("health+slots over HTTP", case, check, examples=HTTP_EXAMPLES)
    assert {"loading", "scraped", "scraped-without-slots"} <= set(out), out


HTTP_EXAMPLES = 2_000  # three real HTTP requests each: the pure /slots parser above takes the EXAMPLES


# ---- 3. rule files --------------------------------------------------------------------------------------------------

_YAML_ODD = [
    "2001-02-30",
    "!!int 0xZZ",
    "!!float abc",
    "!!timestamp x",
    "!!binary '%%'",
    "!!set [1]",
    "~",
    "[]",
    "{}",
    "*anchor",
    "&a [1]",
    "'{{'",
    '"{{ $value | nope }}"',
    "1e400",
    "9" * 400,
    ".inf",
    ".nan",
    "-1",
    "0",
    "yes",
    "'5m'",
    "99999999999d",
    "5x",
    "{a: [b, {c: d}]}",
    '"\\x00"',
    "@",
    "`",
    "|",
    "? [a]\n  : b",
]


def _yaml_value(draw: st.DrawFn, good: list[Any], clean: bool = False) -> str:
    """A YAML scalar/flow text: one of the values listed for the key (the first is valid), or, unless ``clean``,
    something of the wrong type or form."""
    if clean:
        return json.dumps(good[0])
    pick = draw(st.integers(0, 299))
    if pick == 137:  # nesting past Python's recursion limit: rare (a mid value: hypothesis favours the ends)
        return "[" * 600  # ~70 ms to reject
    if pick < 200:
        return json.dumps(draw(st.sampled_from(good)))
    return draw(st.one_of(st.sampled_from(_YAML_ODD), st.text(max_size=10).map(json.dumps)))


_RULE_KEYS = {
    "alert": ["KVHigh", "Q", "bad name", ""],
    "signal": ["kv_cache_usage", "requests_waiting", "ttft_p99", "goodput_ratio", "gpu_memory_used_ratio", "nope"],
    "op": [">", ">=", "<", "==", "!=", "=>"],
    "threshold": [0.95, 1, "slo", -3, 1e9],
    "window": ["5m", "30s", "1h30m", 0],
    "for": ["0s", "5m", 0, "2m"],
    "keep_firing_for": ["0s", "1m"],
    "backend": ["vllm", "llamacpp", "any", "tgi"],
    "labels": [{"severity": "critical"}, {"bad-name": "x"}, {}],
    "annotations": [
        {"summary": "{{ $value | humanizePercentage }} on {{ $labels.target }}"},
        {"summary": "{{ $value | nope }}"},
        {"d": "plain"},
    ],
    "overrides": [{"chat-a": {"threshold": 0.9, "for": "2m"}}, {"x": {"bogus": 1}}, {"y": {"threshold": "a"}}],
}


@st.composite
def _rule_doc(draw: st.DrawFn) -> str:
    """A rule file as YAML text: valid-looking groups and rules whose values are sometimes of the wrong kind."""
    clean = draw(st.integers(0, 2)) == 0  # a third are valid files: the parse path gets exercised too
    out = ["groups:"]
    for g in range(draw(st.integers(0, 2))):
        out.append(f"  - name: {_yaml_value(draw, [f'g{g}', 'serving', '', 'a b'], clean)}")
        if draw(st.booleans()):
            out.append(f"    interval: {_yaml_value(draw, ['15s', '1m', '500ms'], clean)}")
        if not clean and not draw(st.integers(0, 15)):
            out.append(f"    {draw(st.sampled_from(['limit', 'rules2', 'Interval']))}: 1")
        n_rules = draw(st.integers(0, 2))
        out.append("    rules:" if n_rules else "    rules: []")
        for r in range(n_rules):
            keys = draw(st.lists(st.sampled_from(sorted(_RULE_KEYS)), max_size=4, unique=True))
            required = [k for k in ("alert", "signal", "op", "threshold") if clean or draw(st.integers(0, 12))]
            first = True
            for k in dict.fromkeys(required + keys):
                good = [f"A{r}", *_RULE_KEYS[k]] if k == "alert" else _RULE_KEYS[k]
                out.append(f"      {'- ' if first else '  '}{k}: {_yaml_value(draw, good, clean)}")
                first = False
            if not clean and not draw(st.integers(0, 15)):
                out.append(f"      {'- ' if first else '  '}{draw(st.sampled_from(['expr', 'severity', 'For']))}: x")
    return "\n".join(out) + "\n"


_RULE_TEXTS = [
    (ROOT / "alerts" / "default.yaml").read_text(encoding="utf-8"),
    (ROOT / "tests" / "rules" / "scenarios" / "custom.rules.yaml").read_text(encoding="utf-8"),
]


def _check_rules(text: str) -> str:
    try:
        rs = parse_rules(text, "fuzz.yaml")
    except RuleFileError as exc:
        assert exc.path == "fuzz.yaml" and str(exc).startswith("fuzz.yaml:"), exc
        # names the line (YAML also breaks lines at \r, \x85, \u2028, \u2029, as str.splitlines does)
        assert exc.line is not None and 1 <= exc.line <= len(text.splitlines()) + 1, exc
        return "RuleFileError"
    assert isinstance(rs, RuleSet)
    return "parsed"


def test_fuzz_rule_files() -> None:
    strategy = st.one_of(
        _rule_doc(),
        _rule_doc().flatmap(lambda d: _mutated([d])),
        _mutated(_RULE_TEXTS, window=25),
        st.text(max_size=200),
    )
    out = _fuzz("rule files", strategy, _check_rules)
    assert out.get("parsed", 0) >= EXAMPLES // 20 and out.get("RuleFileError", 0) >= EXAMPLES // 20, out


# ---- 4. config ----------------------------------------------------------------------------------------------------

_CONFIG_KEYS: dict[str, Any] = {
    "store": {
        "url": ["sqlite:///tuner.db", "sqlite:///:memory:", 5],
        "retention": {"raw": ["2d", "0s"], "rollup": ["30d"], "rollup_step": ["5m", "-1m"]},
    },
    "listen": ["127.0.0.1:9464", "[::1]:0", "localhost", "1.2.3.4:99999"],
    "defaults": {
        "scrape_interval": ["5s", "500ms", 0, "1h30m"],
        "scrape_timeout": ["3s", "1m"],
        "max_body_bytes": ["10MiB", "500KB", 1024, "0B", "1.5GiB"],
        "signal_window": ["5m"],
    },
    "gpu": {"source": ["nvml", "dcgm", "none", "rocm"], "url": ["http://127.0.0.1:9400/metrics"], "interval": ["10s"]},
    "prometheus": {"url": ["http://127.0.0.1:9090"]},
    "alerting": {
        "rule_files": [["a.yaml"], "a.yaml", []],
        "evaluation_interval": ["15s"],
        "resend_delay": ["1m"],
        "alertmanagers": [["http://127.0.0.1:9093"], ["ftp://x"]],
        "external_url": ["http://t"],
    },
}
_TARGET_KEYS: dict[str, list[Any]] = {
    "name": ["chat", "chat", "small-llama", "has space", "-x"],
    "backend": ["vllm", "llamacpp", "tgi"],
    "url": ["http://127.0.0.1:8000", "127.0.0.1:8000", "http://[::1]:8/"],
    "labels": [{"team": "a"}, {"k": [1]}],
    "scrape_interval": ["5s", "0s"],
    "scrape_timeout": ["3s"],
    "source": ["direct", "prometheus", "file"],
    "prometheus_selector": ['job="vllm"'],
    "flags": [{"max-num-seqs": 8}, {"x": [1]}],
    "slo": [{"ttft_p99": "500ms", "objective": 0.99}, {"objective": 2}, {"e2e_p99": "20s", "bogus": 1}],
}


def _mapping(draw: st.DrawFn, schema: dict[str, Any], indent: int, clean: bool) -> list[str]:
    pad = " " * indent
    out = []
    for key in draw(st.lists(st.sampled_from(sorted(schema)), max_size=4, unique=True)):
        sub = schema[key]
        if isinstance(sub, dict) and (clean or draw(st.integers(0, 4))):
            out.append(f"{pad}{key}:")
            out += _mapping(draw, sub, indent + 2, clean) or [f"{pad}  {{}}"]
        else:
            out.append(f"{pad}{key}: {_yaml_value(draw, sub if isinstance(sub, list) else [sub], clean)}")
    if not clean and not draw(st.integers(0, 12)):
        out.append(f"{pad}{draw(st.sampled_from(['scrape_intervall', 'target', 'Listen', 'url']))}: 1")
    return out


@st.composite
def _config_doc(draw: st.DrawFn) -> str:
    clean = draw(st.integers(0, 2)) == 0  # a third are valid configs
    lines = _mapping(draw, _CONFIG_KEYS, 0, clean)
    if draw(st.integers(0, 3)):
        lines.append("targets:")
        for i in range(draw(st.integers(0, 2))):
            keys = {**_TARGET_KEYS, "name": [f"t{i}", *_TARGET_KEYS["name"]]}
            body = [
                f"    {k}: {_yaml_value(draw, keys[k], clean)}"
                for k in ("name", "backend", "url")
                if clean or draw(st.integers(0, 12))
            ]
            body += (
                _mapping(
                    draw, {k: v for k, v in keys.items() if k not in ("name", "backend", "url", "source")}, 4, clean
                )
                if clean
                else _mapping(draw, keys, 4, clean)
            )
            body = body or ["    {}"]
            lines.append("  - " + body[0].lstrip())
            lines += body[1:]
    return "\n".join(lines) + "\n"


# The documented example config (docs/configuration.md, its first YAML block that starts with `store:`) seeds the
# mutations.
_DOC_CONFIG = re.search(
    r"```yaml\n(store:.*?)```", (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8"), re.S
)


def _check_config(text: str) -> str:
    try:
        cfg = parse_config(text, "fuzz.yaml")
    except ConfigError as exc:
        assert exc.path == "fuzz.yaml" and str(exc).startswith("fuzz.yaml: "), exc
        assert exc.key or "top level" in exc.reason, exc  # names the key (or the line, for YAML errors)
        return "ConfigError"
    assert isinstance(cfg, Config)
    return "parsed"


def test_fuzz_config() -> None:
    texts = [_DOC_CONFIG.group(1)] if _DOC_CONFIG else []
    assert texts, "docs/configuration.md's config example not found"
    strategy = st.one_of(
        _config_doc(), _config_doc().flatmap(lambda d: _mutated([d])), _mutated(texts, window=40), st.text(max_size=200)
    )
    out = _fuzz("config", strategy, _check_config)
    assert out.get("parsed", 0) >= EXAMPLES // 20 and out.get("ConfigError", 0) >= EXAMPLES // 20, out
