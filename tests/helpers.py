"""Shared test helpers: recorded fixtures, a real local HTTP server, a migrated SQLite store.

Also a tiny exposition reader that is independent of the code under test (a regex over the
fixture's sample lines), so tests derive expected values from the recorded text itself.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tuner.store.db import open_engine, upgrade
from tuner.store.store import Store

__all__ = [
    "FIXTURES",
    "VLLM_DIR",
    "LLAMA_DIR",
    "fixture_text",
    "Route",
    "serve",
    "migrated_store",
    "store_recorded_history",
    "parse_labels",
    "sample_lines",
    "series_values",
    "value_of",
    "bucket_counts",
    "slot_tokens",
]

FIXTURES = Path(__file__).parent / "fixtures"
VLLM_DIR = FIXTURES / "vllm-0.32-cpu"
LLAMA_DIR = FIXTURES / "llama-server"


def fixture_text(rel: str) -> str:
    """The text of ``tests/fixtures/<rel>``."""
    return (FIXTURES / rel).read_text(encoding="utf-8")


# ---- a real HTTP server ------------------------------------------------------------------------


@dataclass
class Route:
    """What one path answers. Mutable on purpose: the handler records what it actually sent."""

    status: int = 200
    body: bytes | str = b""
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    delay_s: float = 0.0  # sleep before sending the status line (cut short when the server stops)
    trickle: tuple[int, float] | None = None  # (n bytes, every s): send the body slowly
    stream: Callable[[], Iterable[bytes]] | None = None  # body chunks from a generator instead of `body`
    content_length: int | None = None  # for `stream`: declared length; None sends no Content-Length
    # filled in by the server
    hits: int = 0
    bytes_sent: int = 0
    finished: threading.Event = field(default_factory=threading.Event)  # the handler returned


def _handler(routes: dict[str, Route], stop: threading.Event) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep test output quiet
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            route = routes.get(self.path.split("?")[0])
            if route is None:
                self.send_error(404)
                return
            route.hits += 1
            try:
                self._answer(route)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up: that is what several tests provoke
            finally:
                route.finished.set()

        def _answer(self, route: Route) -> None:
            if route.delay_s and stop.wait(route.delay_s):
                return
            body = route.body.encode() if isinstance(route.body, str) else route.body
            self.send_response(route.status)
            self.send_header("Content-Type", route.content_type)
            if route.stream is None:
                self.send_header("Content-Length", str(len(body)))
            elif route.content_length is not None:
                self.send_header("Content-Length", str(route.content_length))
            self.end_headers()
            if route.stream is not None:
                chunks: Iterable[bytes] = route.stream()
            elif route.trickle is not None:
                n = route.trickle[0]
                chunks = (body[i : i + n] for i in range(0, len(body), n))
            else:
                chunks = (body,)
            for chunk in chunks:
                if stop.is_set():
                    return
                self.wfile.write(chunk)
                self.wfile.flush()
                route.bytes_sent += len(chunk)
                if route.trickle is not None and stop.wait(route.trickle[1]):
                    return

    return Handler


@contextmanager
def serve(routes: dict[str, Route]) -> Iterator[str]:
    """Run a real ThreadingHTTPServer on 127.0.0.1 (a free port); yield its base URL, e.g. http://127.0.0.1:4711."""
    stop = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(routes, stop))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()  # wakes delayed / trickling handlers
        server.shutdown()
        server.server_close()
        thread.join(5)


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# ---- a real SQLite store -----------------------------------------------------------------------


def migrated_store(tmp_path: Path, name: str = "tuner.db") -> Store:
    """A Store over a fresh SQLite file in ``tmp_path``, migrated to head."""
    engine = open_engine(f"sqlite:///{tmp_path / name}")
    upgrade(engine)
    return Store(engine)


def store_recorded_history(
    store: Store,
    t0: float,
    fixtures: Iterable[str] = ("metrics_idle.txt", "metrics_under_load.txt", "metrics_after_load.txt"),
) -> float:
    """Recorded scrapes with counters advancing into ``store``: 12 of target "v" per vLLM fixture (its server
    restarts at the third: process_start_time_seconds moves), then 24 of llama-server target "l"; every 5 s from
    ``t0``. Returns the time of the last vLLM scrape + 5 s (the llama-server scrapes end 5 s before it)."""
    from tuner.collect import llamacpp, vllm
    from tuner.collect.llamacpp import parse_slots
    from tuner.lab.replay import ReplayExposition

    for i, fixture in enumerate(fixtures):
        text = (VLLM_DIR / fixture).read_text()
        if i == 2:  # the server restarted
            text = re.sub(
                r"^(process_start_time_seconds) (\S+)$", lambda m: f"{m[1]} {float(m[2]) + 900}", text, flags=re.M
            )
        replay = ReplayExposition(text, growth=0.05)
        for _ in range(12):
            store.ingest(vllm.snapshot_from_text(replay.render().decode(), target="v", ts=t0))
            t0 += 5
    slots = parse_slots((LLAMA_DIR / "slots_mid_load.json").read_bytes())
    replay_l = ReplayExposition((LLAMA_DIR / "metrics_mid_load.txt").read_text(), growth=0.05)
    for k in range(24):
        store.ingest(
            llamacpp.snapshot_from_text(replay_l.render().decode(), target="l", ts=t0 - 5 * (23 - k), slots=slots)
        )
    return t0


# ---- reading expositions without the code under test -------------------------------------------

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_labels(text: str) -> dict[str, str]:
    return {k: v for k, v in _LABEL.findall(text or "")}


def sample_lines(text: str) -> list[tuple[int, str, dict[str, str], float]]:
    """(line number, metric name, labels, value) of every sample line of an exposition."""
    out = []
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"helper cannot read line {line_no}: {line!r}"
        out.append((line_no, m["name"], parse_labels(m["labels"]), float(m["value"])))
    return out


def series_values(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of ``name`` whose labels include ``labels``."""
    return [
        (lbl, v)
        for _, n, lbl, v in sample_lines(text)
        if n == name and all(lbl.get(k) == want for k, want in labels.items())
    ]


def value_of(text: str, name: str, **labels: str) -> float:
    """The value on the one line of ``name`` matching ``labels`` (asserts there is exactly one)."""
    found = series_values(text, name, **labels)
    assert len(found) == 1, f"expected one {name}{labels} line, found {len(found)}"
    return found[0][1]


def bucket_counts(text: str, base: str, **labels: str) -> dict[float, float]:
    """``{le: count}`` from the ``<base>_bucket`` lines matching ``labels``."""
    return {float(lbl["le"]): v for lbl, v in series_values(text, base + "_bucket", **labels)}


def slot_tokens(slot: dict) -> int:
    """Tokens a busy llama-server slot holds, from its /slots JSON.

    Seen on the recorded server: ``n_prompt_tokens`` grows while generating (e.g. 175 with 101
    processed + 10 cached prompt tokens and 65 decoded), so it already counts generated tokens;
    older builds count the prompt only. Prompt = processed + cached; take the larger, cap at n_ctx.
    """
    decoded = sum(t.get("n_decoded", 0) for t in slot.get("next_token", []))
    prompt = (
        slot.get("n_prompt_tokens_processed", 0) + slot.get("n_prompt_tokens_cache", 0)
        if "n_prompt_tokens_processed" in slot
        else slot["n_prompt_tokens"]
    )
    return min(slot["n_ctx"], max(slot["n_prompt_tokens"], prompt + decoded))


def both_ways(module: ModuleType) -> Any:
    """An autouse fixture that runs each test of a file twice: with ``module.COMPILED``, the compiled part
    (skipped where tuner was built without it; tests/collect/test_numbers.py fails that in CI), and with it set to
    None, so that ``module`` does the same work in Python. Assign it to a name in the test file."""

    @pytest.fixture(autouse=True, params=["compiled", "python"])
    def _both_ways(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
        if request.param == "python":
            monkeypatch.setattr(module, "COMPILED", None)
        elif module.COMPILED is None:
            pytest.skip("tuner was built without its compiled part")

    return _both_ways
