"""The server backends tuner knows, as data: everything that differs between vLLM and llama-server, in one place.

A stage that needs to know "which kind of server" asks its ``Backend`` for the fact (does it count requests, how
are its flags spelled, how does it drain) instead of comparing the backend's name. Adding a backend means adding
one entry here, its metric names to ``collect/catalogue.py``, its parser to ``collect/`` and its flags to
``flags.py``; ``tests/test_backends.py`` runs the same checks over every entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from tuner.names import (
    LLAMACPP_REQUESTS_DEFERRED,
    LLAMACPP_REQUESTS_PROCESSING,
    LLAMACPP_TOKENS_PREDICTED_SECONDS_TOTAL,
    LLAMACPP_TOKENS_PREDICTED_TOTAL,
    VLLM_E2E_REQUEST_LATENCY_SECONDS,
    VLLM_GENERATION_TOKENS_TOTAL,
    VLLM_INTER_TOKEN_LATENCY_SECONDS,
    VLLM_NUM_REQUESTS_RUNNING,
    VLLM_NUM_REQUESTS_WAITING,
    VLLM_REQUEST_QUEUE_TIME_SECONDS,
    VLLM_REQUEST_SUCCESS_TOTAL,
    VLLM_TIME_TO_FIRST_TOKEN_SECONDS,
)

__all__ = ["Backend", "VLLM", "LLAMACPP", "BACKENDS", "backend", "kv_block_size"]


@dataclass(frozen=True)
class Backend:
    name: str  # the config's `backend:` value
    title: str  # what a person calls it
    counts_requests: bool  # exports a finished-request counter and latency histograms (else tokens only)
    dashed_flags: bool  # argv flag keys keep their dashes ("--parallel"); else bare ("max-num-seqs")
    version_style: Literal["release", "build"]  # 0.32.0, or llama.cpp's build number
    drain: Literal["shutdown_timeout", "slots_idle"]  # SIGTERM finishes in-flight work; or wait for idle slots
    model_is_file: bool  # the model is one file (.gguf); else a directory or a hub name
    gate_names_model: bool  # the health gate's request names the served model
    # the benchmark client asks for a new connection per request (Connection: close): llama-server's HTTP library
    # closes kept-alive connections that vLLM's client (aiohttp, 60-s keep-alive) then writes to, and 1-2% of
    # requests failed "Can not write request body" at 30-45 req/s, with --threads-http 64 as well; with close, none
    # (bench/results/2026-11-29-0744-llama-keepalive.md)
    bench_closes_connections: bool = False
    # role -> canonical metric name, for the load profile (signals/load.py) and the verdict
    load_metrics: Mapping[str, str] = field(default_factory=dict)

    @property
    def capacity_unit(self) -> str:
        return "req/s" if self.counts_requests else "tokens/s"

    def version_text(self, version: tuple[int, ...]) -> str:
        return ".".join(map(str, version)) if self.version_style == "release" else f"build {version[0]}"


VLLM = Backend(
    name="vllm",
    title="vLLM",
    counts_requests=True,
    dashed_flags=False,
    version_style="release",
    drain="shutdown_timeout",
    model_is_file=False,
    gate_names_model=True,
    load_metrics={
        "finished": VLLM_REQUEST_SUCCESS_TOTAL,
        "generated": VLLM_GENERATION_TOKENS_TOTAL,
        "running": VLLM_NUM_REQUESTS_RUNNING,
        "waiting": VLLM_NUM_REQUESTS_WAITING,
        "ttft": VLLM_TIME_TO_FIRST_TOKEN_SECONDS,
        "e2e": VLLM_E2E_REQUEST_LATENCY_SECONDS,
        "itl": VLLM_INTER_TOKEN_LATENCY_SECONDS,
        "queue": VLLM_REQUEST_QUEUE_TIME_SECONDS,
    },
)

LLAMACPP = Backend(
    name="llamacpp",
    title="llama-server",
    counts_requests=False,
    dashed_flags=True,
    version_style="build",
    drain="slots_idle",
    model_is_file=True,
    gate_names_model=False,
    bench_closes_connections=True,
    load_metrics={
        "generated": LLAMACPP_TOKENS_PREDICTED_TOTAL,
        "gen_seconds": LLAMACPP_TOKENS_PREDICTED_SECONDS_TOTAL,
        "running": LLAMACPP_REQUESTS_PROCESSING,
        "waiting": LLAMACPP_REQUESTS_DEFERRED,
    },
)

BACKENDS: Mapping[str, Backend] = {b.name: b for b in (VLLM, LLAMACPP)}


def backend(name: str) -> Backend:
    """The backend called ``name``; ValueError naming the known ones."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}") from None


def kv_block_size(config: Mapping[str, object]) -> int | None:
    """The KV block size a vLLM engine reports (the ``block_size`` label of vllm:cache_config_info, as stored with
    its config), or None where it does not say: the prefix cache hits, and the KV cache is allocated, in whole
    blocks of it (16 on a GPU by default, 128 on vLLM's CPU build)."""
    text = str(config.get("block_size", "")).strip()
    return int(text) if text.isdigit() and int(text) > 0 else None
