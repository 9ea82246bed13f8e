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

__all__ = ["Backend", "VLLM", "LLAMACPP", "BACKENDS", "backend"]


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
    # role -> canonical metric name, for the load profile (signals/load.py) and the verdict
    load_metrics: Mapping[str, str] = field(default_factory=dict)

    @property
    def capacity_unit(self) -> str:
        return "req/s" if self.counts_requests else "tokens/s"

    def version_text(self, version: tuple[int, ...]) -> str:
        return ".".join(map(str, version)) if self.version_style == "release" else f"build {version[0]}"


VLLM = Backend(
    name="vllm", title="vLLM", counts_requests=True, dashed_flags=False, version_style="release",
    drain="shutdown_timeout", model_is_file=False, gate_names_model=True,
    load_metrics={"finished": "vllm:request_success_total", "generated": "vllm:generation_tokens_total",
                  "running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
                  "ttft": "vllm:time_to_first_token_seconds", "e2e": "vllm:e2e_request_latency_seconds",
                  "itl": "vllm:inter_token_latency_seconds", "queue": "vllm:request_queue_time_seconds"},
)

LLAMACPP = Backend(
    name="llamacpp", title="llama-server", counts_requests=False, dashed_flags=True, version_style="build",
    drain="slots_idle", model_is_file=True, gate_names_model=False,
    load_metrics={"generated": "llamacpp:tokens_predicted_total",
                  "gen_seconds": "llamacpp:tokens_predicted_seconds_total",
                  "running": "llamacpp:requests_processing", "waiting": "llamacpp:requests_deferred"},
)

BACKENDS: Mapping[str, Backend] = {b.name: b for b in (VLLM, LLAMACPP)}


def backend(name: str) -> Backend:
    """The backend called ``name``; ValueError naming the known ones."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}") from None
