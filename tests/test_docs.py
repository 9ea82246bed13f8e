"""The README is for users and docs/ for the rest: the README's size and its two commands, every command, config
key and exported metric documented, config examples that load, links that resolve, and no dated figures (those
live in bench/, see tests/bench/test_summary.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from tuner.cli import build_parser
from tuner.config import Config, parse_config
from tuner.daemon import metrics
from tuner.signals.derive import LATENCY_HISTOGRAMS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS, ROOT / "bench" / "README.md"]


def _text(p: Path) -> str:
    return p.read_text(encoding="utf-8")


def _prose(text: str) -> str:
    """text without fenced code blocks, inline code and link targets: what a reader takes for prose."""
    text = re.sub(r"(?ms)^```.*?^```", "", text)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def test_the_readme_is_short_and_states_the_two_commands() -> None:
    size = len(README.read_bytes())
    assert size <= 12 * 1024, f"README.md is {size} bytes: keep it to 12 KB, move the rest to docs/"
    text = _text(README)
    assert "bash scripts/demo.sh" in text and "bash scripts/test.sh" in text
    assert re.search(r"^exec bash scripts/test\.sh\b", _text(ROOT / ".ci" / "run"), re.M), (
        ".ci/run must run exactly the README's test command"
    )


def _subcommands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")  # noqa: SLF001 (argparse keeps them there)
    return sorted(sub.choices)  # type: ignore[arg-type]


def test_every_command_is_in_the_readme_command_table() -> None:
    text = _text(README)
    table = text[text.index("## Commands") :]
    table = table[: table.index("\n## ", 3)]
    rows = [line for line in table.splitlines() if line.startswith("| `tuner ")]
    words = {w for row in rows for w in re.findall(r"[a-z][a-z-]*", re.split(r"(?<!\\)\|", row)[1])}
    missing = [c for c in _subcommands() if c not in words]
    assert not missing, f"commands missing from README.md's command table: {missing}"


_SET_BY_EXPANSION = {"group", "replica", "group_url"}  # Target fields a replica group's expansion sets


def _keys(model: type[BaseModel], seen: set[type] | None = None) -> set[str]:
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    out: set[str] = set()
    for name, field in model.model_fields.items():
        if name in _SET_BY_EXPANSION:
            continue
        out.add(name)
        for t in re.findall(r"\b([A-Z]\w+)\b", repr(field.annotation)):
            sub = getattr(__import__("tuner.config", fromlist=[t]), t, None)
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                out |= _keys(sub, seen)
    return out


def test_every_config_key_is_in_the_configuration_reference() -> None:
    doc = _text(ROOT / "docs" / "configuration.md")
    quoted = " ".join(re.findall(r"`([^`\n]+)`", doc))
    keys = _keys(Config)
    assert {"targets", "store", "retention", "drain_timeout", "maintenance_windows", "token_file"} <= keys
    missing = sorted(k for k in keys if not re.search(rf"(?<![\w]){re.escape(k)}(?![\w])", quoted))
    assert not missing, f"config keys missing from docs/configuration.md: {missing}"


def _exported_families() -> set[str]:
    source = Path(metrics.__file__).read_text(encoding="utf-8")
    names = set(re.findall(r'"(tuner_[a-z_]+)"', source)) | {m for m, _ in metrics.SIGNAL_GAUGES.values()}
    names |= {f"tuner_{p}_seconds" for p in LATENCY_HISTOGRAMS}
    assert "tuner_{p}_seconds" not in names and len(names) > 25
    return names


def test_every_metric_tuner_exports_is_in_the_metrics_reference() -> None:
    doc = _text(ROOT / "docs" / "http-api.md")
    counters = {"tuner_scrapes", "tuner_scrape_failures", "tuner_applies"}  # exposed with _total
    missing = sorted(
        n for n in _exported_families() if not re.search(rf"\b{n}{'_total' if n in counters else ''}\b", doc)
    )
    assert not missing, f"tuner's own series missing from docs/http-api.md: {missing}"


def _yaml_blocks(text: str) -> list[str]:
    return re.findall(r"(?ms)^```yaml\n(.*?)^```", text)


@pytest.mark.parametrize(
    "page",
    [README, ROOT / "docs" / "configuration.md", ROOT / "docs" / "apply.md", ROOT / "docs" / "replica-groups.md"],
    ids=lambda p: p.name,
)
def test_the_config_examples_load(page: Path) -> None:
    whole = [b for b in _yaml_blocks(_text(page)) if re.match(r"(store|targets|listen):", b)]
    assert whole, f"{page.name}: no whole config example found"
    for block in whole:
        parse_config(block, f"{page.name} example")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r" ", "-", re.sub(r"[^\w\- ]", "", heading.strip().lower()))


def _anchors(p: Path) -> set[str]:
    text = _text(p)
    heads = {_slug(h.replace("`", "")) for h in re.findall(r"(?m)^#{1,6} (.*)$", re.sub(r"(?ms)^```.*?^```", "", text))}
    return heads | set(re.findall(r'<a id="([^"]+)"></a>', text))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page: Path) -> None:
    text = re.sub(r"(?ms)^```.*?^```", "", _text(page))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no such heading or anchor in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dated_figures_in_the_readme_or_docs(page: Path) -> None:
    prose = _prose(_text(page))
    dates = re.findall(r"\b20\d\d-\d\d-\d\d\b", prose)
    clocks = re.findall(r"\b\d{1,2}:\d\d(?::\d\d)?\b", prose)
    assert not dates and not clocks, (
        f"{page.relative_to(ROOT)} quotes {dates + clocks}: a dated figure belongs in "
        "bench/results/, linked from bench/README.md's summary"
    )


def test_the_no_dates_check_can_fail() -> None:
    prose = _prose(
        "measured on 2026-11-25 at 17:21: 1.16 s, see [the run](../bench/results/2026-11-25-x.md)\n"
        "```yaml\nmaintenance_windows: ['daily 02:00-04:00']\n```\n`Mon-Fri 22:00-02:00`"
    )
    assert re.findall(r"\b20\d\d-\d\d-\d\d\b", prose) == ["2026-11-25"]
    assert re.findall(r"\b\d{1,2}:\d\d(?::\d\d)?\b", prose) == ["17:21"]


def test_what_tuner_points_users_to_exists() -> None:
    """Error messages, --help texts and docstrings point to docs/ pages (and a section a page holds), never to
    README sections, which now live in docs/."""
    bad = []
    for src in sorted((ROOT / "tuner").rglob("*.py")):
        text = _text(src)
        bad += [f"{src.relative_to(ROOT)}: README {m}" for m in re.findall(r"README ['\"][^'\"]+['\"]", text)]
        for page, section in re.findall(r"docs/([\w-]+\.md)(?:, '([^']+)')?", text):
            dest = ROOT / "docs" / page
            if not dest.exists():
                bad.append(f"{src.relative_to(ROOT)}: docs/{page} does not exist")
            elif section and section not in _text(dest):
                bad.append(f"{src.relative_to(ROOT)}: docs/{page} has no '{section}'")
    assert not bad, bad
