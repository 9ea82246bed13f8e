"""A small, bounded load generator for OpenAI-compatible completion servers on this machine.

It exists to put real servers under known load (fixtures, integration tests, the demo), not to benchmark:
requests are bounded in number, concurrency and total time, and only loopback servers are accepted.

Requests never carry `seed`: on vLLM's CPU build a seeded request whose prompt is split by chunked prefill
crashes the whole engine ("CPU Generator does not use offset").

Every request goes on a fresh connection (``Connection: close``), never a kept-alive one. vLLM's uvicorn closes a
kept-alive connection 5 s after its last response (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``). On 2 cores saturated by
vLLM, a client can take that long to read one answer and send its next request on the same connection (the
server read such requests up to 4.8 s after its previous response). Then the request crosses the server's close:
the server never reads it (and logs nothing), and the client gets "Remote end closed connection without
response". That cost 3 of 96 requests here, and none of 192 with the keep-alive raised to 120 s. A fresh
connection carries no idle timer. The loopback handshake costs well under a millisecond per request.
"""

from __future__ import annotations

import ipaddress
import math
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests

__all__ = [
    "LoadResult",
    "make_prompt",
    "raise_priority",
    "run_load",
    "MAX_REQUESTS",
    "MAX_CONCURRENCY",
    "MAX_TIMEOUT_S",
]

MAX_REQUESTS = 10_000
MAX_CONCURRENCY = 64
MAX_TIMEOUT_S = 3600.0
_MAX_ERRORS_KEPT = 20

# Short common words: most BPE vocabularies give each about one token.
_WORDS = (
    "the of and to in is it that for on was with as be at by this from or an are not have but all were "
    "they one had which you can their there more when will what so up out if about who get them some "
    "would like time could into has two other than then its only new see way may these first any work "
    "well also back after use our how over such year most even want because good give day just know"
).split()


@dataclass(frozen=True)
class LoadResult:
    """Outcome of one run_load call. Latencies are whole-request wall times in seconds, sorted."""

    requested: int  # requests asked for (with send_for_s: started)
    ok: int  # HTTP 200 with a JSON body
    failed: int  # errors, timeouts and non-200 answers
    not_sent: int  # skipped because the overall time limit passed first
    latencies_s: tuple[float, ...]  # of ok requests, ascending
    prompt_tokens: int  # sum of usage.prompt_tokens (or llama-server's tokens_evaluated) where reported
    completion_tokens: int  # sum of usage.completion_tokens (or tokens_predicted) where reported
    wall_s: float  # from the first request to the last answer
    errors: tuple[str, ...] = field(default=())  # first few error descriptions, for messages
    retried: int = 0  # attempts sent again (retry_for_s): refused, closed unanswered, HTTP 500/502/503

    def quantile(self, q: float) -> float | None:
        """Latency quantile (nearest rank) in seconds; None when nothing succeeded."""
        if not self.latencies_s:
            return None
        idx = min(len(self.latencies_s) - 1, max(0, math.ceil(q * len(self.latencies_s)) - 1))
        return self.latencies_s[idx]


def _check_loopback(base_url: str) -> str:
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https") or not host:
        raise ValueError(f"base_url {base_url!r}: expected http(s)://host:port")
    if host != "localhost":
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(f"base_url {base_url!r}: load is only sent to loopback servers (127.0.0.0/8, ::1)")
    return base_url.rstrip("/")


def _in_chain(exc: BaseException, found: Callable[[BaseException], bool]) -> bool:
    """Whether ``found`` holds for ``exc`` or any error behind it (requests wraps urllib3's, which wrap the OS's)."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        if found(e):
            return True
        seen.add(id(e))
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None), *e.args]
    return False


def _refused(exc: BaseException) -> bool:
    """Whether a ConnectionRefusedError is behind ``exc``."""
    return _in_chain(exc, lambda e: isinstance(e, ConnectionRefusedError))


def raise_priority(nice: int = -5) -> bool:
    """Run this process's clients ahead of the servers on a shared host, where allowed (root); else a no-op.

    Clients of a server normally run on other machines. Here they share 2 cores with it, and a client starved for
    5 s between connecting and sending (or between two requests on one connection) finds the connection closed by
    the server's idle timer: cpp-httplib's 5 s wait guards even a new connection's first request, uvicorn's 5 s
    keep-alive the next one. Call it before any thread starts: threads inherit it.
    """
    import os

    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        return True
    except (OSError, AttributeError):
        return False


def _closed_unanswered(exc: BaseException) -> bool:
    """Whether the server closed the connection without a byte of answer (http.client.RemoteDisconnected).

    A draining vLLM closes connections it accepted but has not read; so do idle timers (raise_priority). Clients
    of a restarting server send such a request again, as the OpenAI SDK does by default (max_retries=2): it can
    only run twice if the server ran it and then closed without answering.
    """
    import http.client

    import urllib3

    # urllib3-future (installed beside requests by some of our dependencies) has its own HTTP backend and raises
    # a bare ProtocolError with http.client's words instead of RemoteDisconnected
    return _in_chain(
        exc,
        lambda e: (
            isinstance(e, http.client.RemoteDisconnected)
            or (isinstance(e, urllib3.exceptions.ProtocolError) and "closed connection without response" in str(e))
        ),
    )


def make_prompt(index: int, n_words: int, *, distinct: bool) -> str:
    """A deterministic prompt of about n_words words; distinct prompts differ from their first word on."""
    rng = random.Random(index if distinct else 0)  # local RNG: the same prompts on every run
    head = f"request {index}:" if distinct else "request:"
    return " ".join([head] + [rng.choice(_WORDS) for _ in range(max(0, n_words - 1))])


def _tokens_per_word(session: requests.Session, base: str, model: str, timeout: float) -> float:
    """Measure the server's tokens per prompt word with its /tokenize endpoint (vLLM and llama-server)."""
    sample = make_prompt(0, 200, distinct=True)
    for body in ({"model": model, "prompt": sample}, {"content": sample}):
        try:
            resp = session.post(base + "/tokenize", json=body, timeout=timeout)
            if resp.status_code == 200:
                data = resp.json()
                count = data.get("count") or len(data.get("tokens") or [])
                if count:
                    return count / 200
        except (requests.RequestException, ValueError):
            pass
    return 1.3  # typical English BPE ratio when the server cannot tell


def run_load(
    base_url: str,
    *,
    model: str | None,
    n_requests: int,
    concurrency: int,
    prompt_tokens_approx: int,
    max_tokens: int,
    distinct_prompts: bool = True,
    timeout_s: float,
    path: str = "/v1/completions",
    retry_for_s: float = 0.0,
    send_for_s: float | None = None,
    stop: threading.Event | None = None,
    think_s: float = 0.0,
) -> LoadResult:
    """Send n_requests completions, at most `concurrency` at a time, and stop sending after timeout_s.

    path "/v1/completions" (vLLM, llama-server) sends an OpenAI body; "/completion" sends llama-server's
    native body. Prompts are sized to about prompt_tokens_approx tokens of this server's tokenizer.
    Generation ignores end-of-sequence so every request produces max_tokens tokens.

    With ``retry_for_s`` a request the server did not take is sent again every 0.5 s, for up to that long, as
    clients of a restarting server do: a refused connection (nothing listens while it restarts) or HTTP
    500/502/503 (vLLM answers 500 "cannot schedule new futures after shutdown" while it drains), or a connection
    the server closed without a byte of answer (a draining vLLM closes the connections it has not read yet), as
    the OpenAI SDK retries by default. Nothing else is retried. Without ``retry_for_s`` nothing is retried.

    With ``send_for_s`` the clients keep ``concurrency`` requests in flight for that long and then stop starting
    new ones (``requested`` is then the number started), as a steady closed-loop load: no batch ends with a tail
    of idle clients. Requests in flight finish, within timeout_s. ``stop``, once set, ends the sending the same
    way (a caller that does not know in advance how long the load must last).

    With ``think_s`` each client pauses that long after each answer before its next request (a user reading the
    answer): a steady load below the server's capacity instead of a saturating one.
    """
    base = _check_loopback(base_url)
    if not 1 <= n_requests <= MAX_REQUESTS:
        raise ValueError(f"n_requests must be in 1..{MAX_REQUESTS}, got {n_requests}")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency must be in 1..{MAX_CONCURRENCY}, got {concurrency}")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout_s must be in (0, {MAX_TIMEOUT_S}], got {timeout_s}")
    if prompt_tokens_approx < 1 or max_tokens < 1:
        raise ValueError("prompt_tokens_approx and max_tokens must be >= 1")
    if path not in ("/v1/completions", "/completion"):
        raise ValueError(f"path must be /v1/completions or /completion, got {path!r}")
    if not 0 <= think_s <= timeout_s:
        raise ValueError(f"think_s must be in [0, timeout_s={timeout_s}], got {think_s}")
    if send_for_s is not None and not 0 < send_for_s <= timeout_s:
        raise ValueError(f"send_for_s must be in (0, timeout_s={timeout_s}], got {send_for_s}")

    start = time.monotonic()
    deadline = start + timeout_s
    stop_sending = start + send_for_s if send_for_s is not None else math.inf
    with requests.Session() as probe:
        probe.trust_env = False  # loopback: never through a proxy from the environment
        per_word = _tokens_per_word(probe, base, model or "", min(10.0, timeout_s))
    n_words = max(1, round(prompt_tokens_approx / per_word))

    lock = threading.Lock()
    next_index = 0
    latencies: list[float] = []
    errors: list[str] = []
    counts = {"ok": 0, "failed": 0, "not_sent": 0, "prompt": 0, "completion": 0, "retried": 0}

    def body_for(i: int) -> dict[str, object]:
        prompt = make_prompt(i, n_words, distinct=distinct_prompts)
        if path == "/completion":
            return {
                "prompt": prompt,
                "n_predict": max_tokens,
                "ignore_eos": True,
                "temperature": 0.0,
                "cache_prompt": True,
            }
        body: dict[str, object] = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0}
        if model:
            body["model"] = model
        return body

    def record_usage(data: dict[str, Any]) -> None:
        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        prompt = usage.get("prompt_tokens", data.get("tokens_evaluated", 0))
        completion = usage.get("completion_tokens", data.get("tokens_predicted", 0))
        counts["prompt"] += int(prompt or 0)
        counts["completion"] += int(completion or 0)

    def fail(message: str) -> None:
        counts["failed"] += 1
        if len(errors) < _MAX_ERRORS_KEPT:
            errors.append(message)

    def worker() -> None:
        with requests.Session() as session:
            session.trust_env = False  # loopback: never through a proxy from the environment
            session.headers["Connection"] = "close"  # a fresh connection per request (module docstring)
            work(session)

    def work(session: requests.Session) -> None:
        nonlocal next_index
        answered = False
        while True:
            if think_s and answered:  # this client's previous request got its answer (or its error)
                if stop is not None:
                    stop.wait(think_s)
                else:
                    time.sleep(think_s)
            answered = True
            with lock:
                if next_index >= n_requests or time.monotonic() >= stop_sending or (stop is not None and stop.is_set()):
                    return
                i = next_index
                next_index += 1
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    counts["not_sent"] += 1
                    continue
            t0 = time.monotonic()
            retry_until = t0 + retry_for_s
            while True:
                error: Exception | None
                try:
                    resp = session.post(base + path, json=body_for(i), timeout=max(0.1, deadline - time.monotonic()))
                    elapsed = time.monotonic() - t0
                    data = resp.json() if resp.status_code == 200 else None
                    not_taken = resp.status_code in (500, 502, 503)
                    error = None
                except requests.ConnectionError as e:  # refused, or closed without an answer
                    resp, data, error = None, None, e
                    not_taken = _refused(e) or _closed_unanswered(e)
                except (requests.RequestException, ValueError) as e:
                    resp, data, error, not_taken = None, None, e, False
                if not_taken and time.monotonic() + 0.5 < min(retry_until, deadline):
                    with lock:
                        counts["retried"] += 1
                    time.sleep(0.5)
                    continue
                break
            if resp is None:
                with lock:
                    fail(f"request {i}: {type(error).__name__}: {error}"[:300])
                continue
            with lock:
                if resp.status_code == 200 and isinstance(data, dict):
                    counts["ok"] += 1
                    latencies.append(elapsed)
                    record_usage(data)
                else:
                    fail(f"request {i}: HTTP {resp.status_code}: {resp.text[:200]}")

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="tuner-load") as pool:
        for f in [pool.submit(worker) for _ in range(concurrency)]:
            f.result()

    return LoadResult(
        requested=next_index,
        ok=counts["ok"],
        failed=counts["failed"],
        not_sent=counts["not_sent"],
        latencies_s=tuple(sorted(latencies)),
        prompt_tokens=counts["prompt"],
        completion_tokens=counts["completion"],
        wall_s=time.monotonic() - start,
        errors=tuple(errors),
        retried=counts["retried"],
    )
