"""Serve N endpoints of a recorded vLLM exposition from one process: one listening socket each.

Each endpoint has its own ReplayExposition, so its counters and histograms advance on every scrape
(whoever scrapes it). ``--churn N`` renames every endpoint's ``model_name`` label every N of its scrapes
(``tiny-llama`` -> ``tiny-llama-c1`` ...): labels that churn, as a server whose model is swapped. A POST to
/v1/completions answers one choice, as vLLM does: what an apply's health gate asks for. asyncio with a minimal HTTP/1.1 keep-alive responder keeps this process far
cheaper than the scrapers it feeds; the bench measures its CPU and reports it separately.

    python bench/farm.py --targets 1000 --fixture tests/fixtures/vllm-0.32-cpu/metrics_under_load.txt \
        --ports-file /tmp/ports.txt
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

from tuner.lab.replay import ReplayExposition  # noqa: E402

_HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: %d\r\n%s\r\n"
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
_COMPLETION = b'{"id": "farm", "object": "text_completion", "choices": [{"index": 0, "text": " hi"}]}'
_JSON = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
_MAX_REQUEST = 65536  # a request head larger than this is not a scraper's: drop the connection


def churned(body: bytes, scrapes: int, every: int) -> bytes:
    """body with its model_name renamed for the ``scrapes // every``-th time (as recorded while that is 0)."""
    k = scrapes // every if every > 0 else 0
    return body if k == 0 else body.replace(b'model_name="tiny-llama"', b'model_name="tiny-llama-c%d"' % k)


class _Endpoint(asyncio.Protocol):
    def __init__(self, expo: ReplayExposition, churn: int = 0) -> None:
        self.expo = expo
        self.churn = churn
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, _, rest = self.buf.partition(b"\r\n\r\n")
            request_line, _, headers = head.partition(b"\r\n")
            length = next(
                (
                    int(h.split(b":", 1)[1])
                    for h in headers.lower().split(b"\r\n")
                    if h.startswith(b"content-length:") and h.split(b":", 1)[1].strip().isdigit()
                ),
                0,
            )
            if len(rest) < length:  # the body is still on its way
                break
            self.buf = rest[length:]
            parts = request_line.split(b" ")
            path = parts[1] if len(parts) > 1 else b""
            close = b"connection: close" in headers.lower() or request_line.endswith(b"HTTP/1.0")
            extra = b"Connection: close\r\n" if close else b""
            if parts[0] == b"POST" and path == b"/v1/completions":
                self.transport.write(_JSON % (len(_COMPLETION), extra) + _COMPLETION)
                if close:
                    self.transport.close()
                    return
                continue
            if path == b"/metrics":
                scrapes = self.expo.scrapes
                body = churned(self.expo.render(), scrapes, self.churn)
            elif path == b"/health":
                body = b""
            else:
                self.transport.write(_NOT_FOUND)
                continue
            self.transport.write(_HEADERS % (len(body), extra) + body)
            if close:
                self.transport.close()
                return
        if len(self.buf) > _MAX_REQUEST:
            self.transport.close()


async def _serve(n: int, text: str, ports_file: Path, growth: float, churn: int = 0) -> None:
    loop = asyncio.get_running_loop()
    servers, ports = [], []
    for _ in range(n):
        expo = ReplayExposition(text, growth=growth)
        server = await loop.create_server(lambda e=expo: _Endpoint(e, churn), "127.0.0.1", 0, backlog=128)
        servers.append(server)
        ports.append(server.sockets[0].getsockname()[1])
    tmp = ports_file.with_suffix(".tmp")
    tmp.write_text("\n".join(map(str, ports)) + "\n")
    tmp.rename(ports_file)  # the bench waits for this file: it appears complete or not at all
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", type=int, required=True)
    ap.add_argument("--fixture", type=Path, required=True)
    ap.add_argument("--ports-file", type=Path, required=True)
    ap.add_argument("--growth", type=float, default=0.01, help="per-scrape growth of counters (fraction)")
    ap.add_argument(
        "--churn",
        type=int,
        default=0,
        metavar="N",
        help="rename each endpoint's model_name label every N of its scrapes (0: never)",
    )
    args = ap.parse_args()
    asyncio.run(
        _serve(args.targets, args.fixture.read_text(encoding="utf-8"), args.ports_file, args.growth, args.churn)
    )


if __name__ == "__main__":
    main()
