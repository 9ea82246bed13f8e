"""``tuner judge``: the apply verdict on recorded data, so anyone can check it.

Two directories, each a series of expositions named ``<unix_ms>.txt`` (or ``.txt.gz``; llama-server: an optional
``<unix_ms>.slots.json`` beside each), are read through tuner's own ingest into a throwaway store, and the
window of each is judged exactly as an apply is (tuner/apply/verdict.py). Or two time ranges of a configured
target's store.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from tuner.app.session import Session
from tuner.apply.verdict import Verdict, judge
from tuner.collect import llamacpp
from tuner.collect.scrape import snapshot_from_text
from tuner.config import Slo, parse_duration, replica_groups
from tuner.errors import ConfigError, ExpositionError, InputFileError, ScrapeError
from tuner.files import MAX_FILE_BYTES, read_text
from tuner.signals.load import profile
from tuner.store.db import open_engine, upgrade
from tuner.store.store import Store

__all__ = ["judge_dirs", "judge_target", "read_series", "parse_range"]

_NAME = re.compile(r"^(\d{10,16})\.txt(\.gz)?\Z")


def read_series(directory: Path, *, max_bytes: int = MAX_FILE_BYTES) -> list[tuple[float, str, object | None]]:
    """(unix seconds, exposition text, llama-server slots or None) per file, in time order. Each file is read (and
    a ``.gz`` one decompressed) up to ``max_bytes``, as a scrape's body is: anything larger, truncated or corrupt
    is an ExpositionError naming the file."""
    if not directory.is_dir():
        raise ConfigError(str(directory), "", "not a directory of expositions named <unix_ms>.txt")
    out = []
    for path in sorted(directory.iterdir()):
        m = _NAME.match(path.name)
        if not m:
            continue
        try:
            text = read_text(path, max_bytes=max_bytes, gzipped=bool(m.group(2)), cap="--max-bytes")
        except InputFileError as exc:
            raise ExpositionError(f"{path}: cannot be read: {exc.reason}") from None
        slots_path = directory / f"{m.group(1)}.slots.json"
        slots = None
        if slots_path.exists():
            try:
                slots = llamacpp.parse_slots(json.loads(read_text(slots_path, max_bytes=max_bytes, cap="--max-bytes")))
            except InputFileError as exc:
                raise ExpositionError(f"{slots_path}: cannot be read: {exc.reason}") from None
            except (ValueError, RecursionError) as exc:
                raise ExpositionError(f"{slots_path}: {exc}") from None
        out.append((int(m.group(1)) / 1000, text, slots))
    return sorted(out, key=lambda x: x[0])


def _ingest(store: Store, name: str, backend: str, directory: Path, max_bytes: int) -> tuple[float, float]:
    series = read_series(directory, max_bytes=max_bytes)
    count = 0
    for ts, text, slots in series:
        try:
            snap = snapshot_from_text(backend, text, target=name, ts=ts, slots=slots)  # type: ignore[arg-type]
        except (ExpositionError, ScrapeError) as exc:
            raise ExpositionError(f"{directory}/{int(ts * 1000)}.txt: {exc}") from None
        store.ingest(snap)
        count += 1
    if count < 2:
        raise ExpositionError(
            f"{directory}: {count} readable exposition(s) named <unix_ms>.txt; the verdict needs "
            "at least two to read counters as differences"
        )
    return series[0][0], series[-1][0]


def judge_dirs(
    before: Path, after: Path, *, backend: str, slo: Slo | None, min_requests: int, max_bytes: int = MAX_FILE_BYTES
) -> Verdict:
    with tempfile.TemporaryDirectory(prefix="tuner-judge-") as tmp:
        engine = open_engine(f"sqlite:///{Path(tmp) / 'judge.db'}")
        try:
            upgrade(engine)
            store = Store(engine)
            windows = {}
            for side, directory in (("before", before), ("after", after)):
                store.ensure_target(side, backend, "")
                windows[side] = _ingest(store, side, backend, directory, max_bytes)
            profiles = {side: profile(store.window(side, *windows[side]), slo=slo) for side in windows}
        finally:
            engine.dispose()
    return judge(profiles["before"], profiles["after"], min_requests=min_requests)


def parse_range(text: str, *, now: float, what: str) -> tuple[float, float]:
    """``START..END``: unix seconds, or a duration before now (``10m..5m``), or ``now``."""
    parts = text.split("..")
    if len(parts) != 2:
        raise ConfigError("command line", what, f"{text!r}: expected START..END (unix seconds, or durations ago)")

    def one(p: str) -> float:
        p = p.strip()
        if p == "now":
            return now
        try:
            return float(p)
        except ValueError:
            pass
        try:
            return now - parse_duration(p).total_seconds()
        except (ValueError, TypeError):
            raise ConfigError("command line", what, f"{p!r}: not unix seconds, a duration ago, or now") from None

    start, end = one(parts[0]), one(parts[1])
    if end <= start:
        raise ConfigError("command line", what, f"{text!r}: the end must come after the start")
    return start, end


def judge_target(session: Session, target: str, before: str, after: str, *, now: float) -> Verdict:
    """The verdict on two time ranges (``START..END``) of a configured target's store, as an apply judges; a
    replica group's name judges what all its replicas served together, as a rolling apply is judged."""
    members = replica_groups(session.cfg.targets).get(target)
    t = members[0] if members else session.cfg.target(target)
    return session.applier(lambda _m: None).observer.judge_windows(
        t,
        parse_range(before, now=now, what="--before"),
        parse_range(after, now=now, what="--after"),
        group=members is not None,
    )
