"""vLLM: ``/metrics`` (V1 names, with aliases for renamed ones) and ``/health`` → TargetSnapshot."""

from __future__ import annotations

import time

from tuner.collect import http
from tuner.collect.exposition import decode_body
from tuner.collect.layout import Layouts, engines_from_text
from tuner.collect.snapshots import TargetSnapshot
from tuner.errors import ScrapeError

__all__ = ["snapshot_from_text", "scrape"]


def snapshot_from_text(
    text: str,
    *,
    target: str,
    ts: float,
    duration_s: float = 0.0,
    body_bytes: int = 0,
    default_model: str = "",
    healthy: bool | None = None,
    layouts: Layouts | None = None,
) -> TargetSnapshot:
    """Parse one vLLM exposition; ExpositionError if the body is invalid, ScrapeError if it is not vLLM's.
    With ``layouts``, a body shaped like this target's last one is read without parsing (same result)."""
    engines, problems = engines_from_text(
        text, "vllm", target=target, default_model=default_model or target, layouts=layouts
    )
    return TargetSnapshot(
        target=target,
        backend="vllm",
        ts=ts,
        duration_s=duration_s,
        engines=engines,
        problems=tuple(problems),
        body_bytes=body_bytes or len(text),
        healthy=healthy,
    )


def scrape(
    base_url: str,
    *,
    target: str,
    timeout_s: float,
    max_bytes: int,
    now: float | None = None,
    layouts: Layouts | None = None,
    peers: http.Peers | None = None,
    health: bool = True,
) -> TargetSnapshot:
    """GET /metrics then, with ``health``, /health (one connection) within one ``timeout_s`` budget; a snapshot
    whose ``healthy`` is None when /health was not asked or no time was left for it."""
    ts = time.time() if now is None else now
    start = time.monotonic()
    with http.peer_for(peers, target, base_url) as peer:
        resp = peer.get("/metrics", timeout_s=timeout_s, max_bytes=max_bytes)
        if resp.status != 200:
            raise ScrapeError(
                f"{base_url}/metrics answered HTTP {resp.status}: "
                f"{resp.body[:200].decode('utf-8', 'replace').strip()!r}"
            )
        healthy = _health(peer, deadline=start + timeout_s) if health else None
    text = decode_body(resp.body)
    return snapshot_from_text(
        text,
        target=target,
        ts=ts,
        duration_s=time.monotonic() - start,
        body_bytes=len(resp.body),
        healthy=healthy,
        layouts=layouts,
    )


def _health(peer: http.Peer, *, deadline: float) -> bool | None:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return None
    try:
        return peer.get("/health", timeout_s=remaining, max_bytes=65536).status == 200
    except ScrapeError:
        return False
