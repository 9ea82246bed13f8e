"""One scrape of one configured target, whatever its backend and source."""

from __future__ import annotations

from tuner.collect import llamacpp, vllm
from tuner.collect.snapshots import TargetSnapshot
from tuner.config import Config, Target

__all__ = ["scrape_target"]


def scrape_target(target: Target, cfg: Config, *, now: float, timeout_s: float | None = None) -> TargetSnapshot:
    """Raise ScrapeError / ExpositionError on failure; the caller records it. ``timeout_s`` overrides the
    configured scrape timeout."""
    timeout = cfg.timeout(target).total_seconds() if timeout_s is None else timeout_s
    max_bytes = cfg.defaults.max_body_bytes
    if target.source == "prometheus":
        from tuner.collect.promsource import scrape_via_prometheus

        assert cfg.prometheus is not None  # the config validator guarantees it
        return scrape_via_prometheus(cfg.prometheus.url, target, timeout_s=timeout, now=now)
    if target.backend == "vllm":
        return vllm.scrape(target.url, target=target.name, timeout_s=timeout, max_bytes=max_bytes, now=now)
    return llamacpp.scrape(target.url, target=target.name, timeout_s=timeout, max_bytes=max_bytes,
                           model_name=target.labels.get("model_name", ""), now=now)
