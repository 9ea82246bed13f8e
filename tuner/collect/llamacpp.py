"""llama-server: ``/metrics`` (every ``llamacpp:`` series), ``/slots`` and ``/health`` → TargetSnapshot; ``/props``
→ Props (what the running server says of its own config).

llama-server has no KV-cache gauge any more, so KV use is derived from /slots: tokens held by busy
slots over the whole context (``-c`` is split across ``--parallel`` slots).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from tuner.collect import http
from tuner.collect.catalogue import spec
from tuner.collect.exposition import decode_body
from tuner.collect.layout import Layouts, engines_from_text
from tuner.collect.snapshots import EngineSnapshot, SlotsState, TargetSnapshot
from tuner.errors import ExpositionError, MetricsDisabledError, ScrapeError

__all__ = ["Props", "parse_slots", "props", "snapshot_from_text", "scrape"]

_MAX_TOKENS = 2**53  # token counts are stored as floats: past this one would overflow or lose its units


@dataclass(frozen=True)
class Props:
    """What a running llama-server says of its config on ``GET /props``; a field it does not give, or gives as no
    positive whole count (a count) or no text (the rest), is None."""

    total_slots: int | None  # --parallel, or its build's default where that was left out (4 on this machine's build)
    n_ctx: int | None  # one slot's context: -c / slots
    model_path: str | None
    build_info: str | None


def props(url: str, *, timeout_s: float) -> Props | None:
    """``GET {url}/props``; None where the server does not answer it with a JSON object."""
    try:
        body = http.get_json(f"{url}/props", timeout_s=timeout_s)
    except ScrapeError:
        return None
    if not isinstance(body, dict):
        return None
    settings = body.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    return Props(
        total_slots=_count(body.get("total_slots")),
        n_ctx=_count(n_ctx),
        model_path=_text(body.get("model_path")),
        build_info=_text(body.get("build_info")),
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def parse_slots(data: Any) -> SlotsState:
    """/slots JSON (a list of slot objects) → SlotsState; ExpositionError names what is wrong."""
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise ExpositionError(f"/slots is not JSON ({exc})") from None
        except RecursionError:
            raise ExpositionError("/slots is not JSON tuner can read (nested too deeply)") from None
    if not isinstance(data, list) or not data:
        raise ExpositionError(f"/slots: expected a non-empty JSON list of slots, got {type(data).__name__}")
    busy = in_use = 0
    n_ctx = None
    for i, slot in enumerate(data):
        if not isinstance(slot, dict):
            raise ExpositionError(f"/slots[{i}]: expected an object, got {type(slot).__name__}")
        ctx = slot.get("n_ctx")
        if not isinstance(ctx, int) or isinstance(ctx, bool) or not 0 < ctx <= _MAX_TOKENS:
            raise ExpositionError(f"/slots[{i}].n_ctx: expected a positive integer up to 2**53, got {_short(ctx)}")
        n_ctx = ctx if n_ctx is None else max(n_ctx, ctx)
        if slot.get("is_processing") is True:
            busy += 1
            in_use += _slot_tokens(slot, i, ctx)
    return SlotsState(slots_total=len(data), slots_busy=busy, slot_context_tokens=n_ctx or 0, kv_tokens_in_use=in_use)


def _slot_tokens(slot: dict[str, Any], i: int, n_ctx: int) -> int:
    """Tokens a busy slot holds in the KV cache: its prompt plus what it has generated, at most n_ctx.

    Recent llama-server builds count generated tokens in ``n_prompt_tokens`` as they go (it reads
    prompt + decoded); older ones count the prompt only. The prompt is also processed + cached
    tokens, so the larger of the two readings is right for both.
    """
    n_prompt = _int(slot.get("n_prompt_tokens"), f"/slots[{i}].n_prompt_tokens")
    next_token = slot.get("next_token") or []
    if not isinstance(next_token, list):
        raise ExpositionError(f"/slots[{i}].next_token: expected a list, got {type(next_token).__name__}")
    decoded = sum(
        _int(nt.get("n_decoded"), f"/slots[{i}].next_token.n_decoded") for nt in next_token if isinstance(nt, dict)
    )
    if "n_prompt_tokens_processed" in slot or "n_prompt_tokens_cache" in slot:
        prompt = _int(slot.get("n_prompt_tokens_processed"), f"/slots[{i}].n_prompt_tokens_processed") + _int(
            slot.get("n_prompt_tokens_cache"), f"/slots[{i}].n_prompt_tokens_cache"
        )
    else:
        prompt = n_prompt
    return min(n_ctx, max(n_prompt, prompt + decoded))


def _int(value: Any, where: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_TOKENS:
        raise ExpositionError(f"{where}: expected a non-negative integer up to 2**53, got {_short(value)}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _with_slots(engine: EngineSnapshot, slots: SlotsState) -> EngineSnapshot:
    values = dict(engine.values)
    for metric, value in (
        ("tuner:slots_total", slots.slots_total),
        ("tuner:slots_busy", slots.slots_busy),
        ("tuner:slot_context_tokens", slots.slot_context_tokens),
        ("tuner:kv_tokens_in_use", slots.kv_tokens_in_use),
        ("tuner:kv_cache_usage", slots.kv_cache_usage),
    ):
        values[(spec(metric).name, ())] = float(value)
    return EngineSnapshot(
        backend=engine.backend,
        engine=engine.engine,
        model_name=engine.model_name,
        values=values,
        histograms=engine.histograms,
        config=engine.config,
    )


def snapshot_from_text(
    text: str,
    *,
    target: str,
    ts: float,
    slots: SlotsState | None = None,
    duration_s: float = 0.0,
    body_bytes: int = 0,
    model_name: str = "",
    healthy: bool | None = None,
    problems: tuple[str, ...] = (),
    layouts: Layouts | None = None,
) -> TargetSnapshot:
    """With ``layouts``, a body shaped like this target's last one is read without parsing (same result)."""
    engines, body_problems = engines_from_text(
        text, "llamacpp", target=target, default_model=model_name or target, layouts=layouts
    )
    found = list(dict.fromkeys([*problems, *body_problems]))
    if slots is not None:
        engines = tuple(_with_slots(e, slots) for e in engines)
    return TargetSnapshot(
        target=target,
        backend="llamacpp",
        ts=ts,
        duration_s=duration_s,
        engines=engines,
        problems=tuple(found),
        body_bytes=body_bytes or len(text),
        slots=slots,
        healthy=healthy,
    )


def scrape(
    base_url: str,
    *,
    target: str,
    timeout_s: float,
    max_bytes: int,
    model_name: str = "",
    now: float | None = None,
    layouts: Layouts | None = None,
    peers: http.Peers | None = None,
) -> TargetSnapshot:
    """GET /health, /metrics and /slots within one ``timeout_s`` budget."""
    ts = time.time() if now is None else now
    start = time.monotonic()

    def remaining() -> float:
        return max(0.05, start + timeout_s - time.monotonic())

    with http.peer_for(peers, target, base_url) as peer:
        health = peer.get("/health", timeout_s=remaining(), max_bytes=65536)
        if health.status == 503:
            raise ScrapeError(f"{base_url}/health answered 503: llama-server is still loading the model")
        try:
            resp = peer.get("/metrics", timeout_s=remaining(), max_bytes=max_bytes)
        except ScrapeError as exc:
            # /health is answered by the HTTP threads, /metrics by the loop that runs the slots: a stuck loop answers
            # the one and not the other (tests/fixtures/stall/README.md). Say so, and keep /health's answer.
            if health.status == 200:
                stuck = ScrapeError(f"{exc}; /health answered 200: the loop that runs the slots does not answer")
                stuck.healthy = True
                raise stuck from None
            raise
        if resp.status == 501:
            raise MetricsDisabledError(f"{base_url}/metrics")
        if resp.status != 200:
            raise ScrapeError(
                f"{base_url}/metrics answered HTTP {resp.status}: "
                f"{resp.body[:200].decode('utf-8', 'replace').strip()!r}"
            )
        text = decode_body(resp.body)
        problems: list[str] = []
        slots = None
        try:
            sresp = peer.get("/slots", timeout_s=remaining(), max_bytes=max_bytes, accept="application/json")
            if sresp.status == 200:
                slots = parse_slots(sresp.body)
            else:
                problems.append(
                    f"/slots answered HTTP {sresp.status} (started with --no-slots?); KV use cannot be derived"
                )
        except (ScrapeError, ExpositionError) as exc:
            problems.append(f"/slots: {exc}")
    return snapshot_from_text(
        text,
        target=target,
        ts=ts,
        slots=slots,
        duration_s=time.monotonic() - start,
        body_bytes=len(resp.body),
        model_name=model_name,
        healthy=health.status == 200,
        problems=tuple(problems),
        layouts=layouts,
    )
