"""One scrape of one configured target, whatever its backend and source; and a saved exposition read back."""

from __future__ import annotations

from typing import Protocol

from tuner.collect import llamacpp, vllm
from tuner.collect.http import Peers
from tuner.collect.layout import Layouts
from tuner.collect.snapshots import SlotsState, TargetSnapshot
from tuner.config import Config, Target

__all__ = ["scrape_target", "scrape_url", "snapshot_from_text"]


class _Reader(Protocol):
    """What collect knows of one backend: how to scrape a live server and how to read a saved exposition."""

    def scrape(
        self,
        base_url: str,
        *,
        target: str,
        timeout_s: float,
        max_bytes: int,
        model_name: str,
        now: float | None,
        layouts: Layouts | None,
        peers: Peers | None,
        health: bool,
    ) -> TargetSnapshot: ...

    def parse(
        self, text: str, *, target: str, ts: float, slots: SlotsState | None, model_name: str
    ) -> TargetSnapshot: ...


class _Vllm:
    def scrape(
        self,
        base_url: str,
        *,
        target: str,
        timeout_s: float,
        max_bytes: int,
        model_name: str,
        now: float | None,
        layouts: Layouts | None,
        peers: Peers | None,
        health: bool,
    ) -> TargetSnapshot:
        return vllm.scrape(
            base_url,
            target=target,
            timeout_s=timeout_s,
            max_bytes=max_bytes,
            now=now,
            layouts=layouts,
            peers=peers,
            health=health,
        )

    def parse(self, text: str, *, target: str, ts: float, slots: SlotsState | None, model_name: str) -> TargetSnapshot:
        return vllm.snapshot_from_text(text, target=target, ts=ts)  # vLLM names its model in every series


class _Llamacpp:
    def scrape(
        self,
        base_url: str,
        *,
        target: str,
        timeout_s: float,
        max_bytes: int,
        model_name: str,
        now: float | None,
        layouts: Layouts | None,
        peers: Peers | None,
        health: bool,
    ) -> TargetSnapshot:
        # /health always: it says whether the model is loaded (503), which decides whether /metrics is read
        return llamacpp.scrape(
            base_url,
            target=target,
            timeout_s=timeout_s,
            max_bytes=max_bytes,
            model_name=model_name,
            now=now,
            layouts=layouts,
            peers=peers,
        )

    def parse(self, text: str, *, target: str, ts: float, slots: SlotsState | None, model_name: str) -> TargetSnapshot:
        return llamacpp.snapshot_from_text(text, target=target, ts=ts, slots=slots, model_name=model_name)


READERS: dict[str, _Reader] = {"vllm": _Vllm(), "llamacpp": _Llamacpp()}


def _reader(backend: str) -> _Reader:
    try:
        return READERS[backend]
    except KeyError:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(READERS)}") from None


def scrape_url(
    backend: str,
    base_url: str,
    *,
    target: str,
    timeout_s: float,
    max_bytes: int,
    model_name: str = "",
    now: float | None = None,
    layouts: Layouts | None = None,
    peers: Peers | None = None,
    health: bool = True,
) -> TargetSnapshot:
    """One scrape of a live server (ScrapeError / ExpositionError on failure). ``layouts``: see collect/layout.py;
    ``peers``: connections kept from the target's last scrape (collect/http.py); ``health``: ask vLLM's /health
    too (llama-server's is always asked: it says whether the model is loaded)."""
    return _reader(backend).scrape(
        base_url,
        target=target,
        timeout_s=timeout_s,
        max_bytes=max_bytes,
        model_name=model_name,
        now=now,
        layouts=layouts,
        peers=peers,
        health=health,
    )


def snapshot_from_text(
    backend: str, text: str, *, target: str, ts: float, slots: SlotsState | None = None, model_name: str = ""
) -> TargetSnapshot:
    """A saved exposition (and llama-server's /slots beside it) read back as a scrape."""
    return _reader(backend).parse(text, target=target, ts=ts, slots=slots, model_name=model_name)


def scrape_target(
    target: Target,
    cfg: Config,
    *,
    now: float,
    timeout_s: float | None = None,
    layouts: Layouts | None = None,
    peers: Peers | None = None,
    health: bool = True,
) -> TargetSnapshot:
    """Raise ScrapeError / ExpositionError on failure; the caller records it. ``timeout_s`` overrides the
    configured scrape timeout."""
    timeout = cfg.timeout(target).total_seconds() if timeout_s is None else timeout_s
    if target.source == "prometheus":
        from tuner.collect.promsource import scrape_via_prometheus

        assert cfg.prometheus is not None  # the config validator guarantees it
        return scrape_via_prometheus(cfg.prometheus.url, target, timeout_s=timeout, now=now)
    return scrape_url(
        target.backend,
        target.url,
        target=target.name,
        timeout_s=timeout,
        max_bytes=cfg.defaults.max_body_bytes,
        model_name=target.labels.get("model_name", ""),
        now=now,
        layouts=layouts,
        peers=peers,
        health=health,
    )
