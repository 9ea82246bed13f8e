"""Fixtures for the integration tier: real vLLM (CPU), llama-server and Prometheus on loopback ports.

Install the parts with `eval "$(bash scripts/setup-real-servers.sh | grep ^export)"`. A missing part skips
the tests that need it, or fails them when TUNER_REQUIRE_REAL_SERVERS=1 (CI sets it: there a skip would
hide a broken setup). Every test in this folder is marked `integration`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import realservers
from realservers import Part, RealServer

from tuner.apply.launch import FlagValue

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The hook sees the whole session's items; mark only those collected from this folder.
    for item in items:
        if _HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.integration)


def require(*parts: Part) -> None:
    """Skip (or fail, under TUNER_REQUIRE_REAL_SERVERS=1) unless every part is installed."""
    reasons = [r for r in (p.missing_reason() for p in parts) if r]
    if not reasons:
        return
    message = "; ".join(reasons)
    if os.environ.get("TUNER_REQUIRE_REAL_SERVERS") == "1":
        pytest.fail(f"TUNER_REQUIRE_REAL_SERVERS=1 but {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """The tiny model on vLLM CPU (--enforce-eager --max-model-len 1024 --max-num-seqs 8), shared per session."""
    require(realservers.VLLM_PYTHON, realservers.TINY_MODEL)
    server = realservers.start_vllm(tmp_path_factory.mktemp("vllm"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def vllm_server_factory(tmp_path: Path) -> Iterator[Callable[..., RealServer]]:
    """Start more vLLM servers with custom flags/env: factory(flags={...}, env={...}, kvcache_space_gib=1).

    Each takes ~20–50 s and ~3 GB; they are stopped at the end of the test.
    """
    require(realservers.VLLM_PYTHON, realservers.TINY_MODEL)
    started: list[RealServer] = []

    def factory(
        flags: Mapping[str, FlagValue] | None = None, env: Mapping[str, str] | None = None, **kwargs: object
    ) -> RealServer:
        server = realservers.start_vllm(tmp_path / f"vllm-{len(started)}", flags=flags, env=env, **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server

    try:
        yield factory
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """llama-server on the tiny GGUF with --metrics --parallel 2 -c 1024 -t 1, shared per session."""
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF)
    server = realservers.start_llama_server(tmp_path_factory.mktemp("llama"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def llama_server_no_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """llama-server started without --metrics: its /metrics answers 501."""
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF)
    server = realservers.start_llama_server(tmp_path_factory.mktemp("llama-nometrics"), flags={"--metrics": None})
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def llama_server_factory(tmp_path: Path) -> Iterator[Callable[..., RealServer]]:
    """Start llama-servers with custom flags: factory(flags={"--parallel": 4}); stopped after the test."""
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF)
    started: list[RealServer] = []

    def factory(flags: Mapping[str, FlagValue] | None = None, **kwargs: object) -> RealServer:
        server = realservers.start_llama_server(tmp_path / f"llama-{len(started)}", flags=flags, **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server

    try:
        yield factory
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Callable[..., RealServer]]:
    """Start Prometheus scraping targets: factory(["127.0.0.1:PORT"], interval_s=1.0) -> server with .url.

    Each gets its own config and TSDB dir under tmp_path; all are stopped after the test. With a 1 s
    interval the first sample is queryable after ~6 s: poll, do not sleep a fixed time.
    """
    require(realservers.PROMETHEUS)
    started: list[RealServer] = []

    def factory(targets: list[str], interval_s: float = 1.0, job: str = "tuner-test") -> RealServer:
        server = realservers.start_prometheus(tmp_path, targets, interval_s=interval_s, job=job)
        started.append(server)
        return server

    try:
        yield factory
    finally:
        for server in started:
            server.stop(grace_s=10)
