"""HAProxy's runtime API: take one replica out of rotation, wait until it is idle, put it back, wait until it is UP.

The API is HAProxy's admin socket (``stats socket PATH mode 600 level admin`` in ``global``); one command per
connection, answered and closed. ``set server BACKEND/SERVER state drain`` sends no new requests to that server
(sessions already on it finish), ``state ready`` takes it back; ``show stat`` is CSV with ``qcur`` (queued),
``scur`` (current sessions) and ``status`` (UP, DOWN, DRAIN, MAINT, or ``DOWN 1/2`` while a check flips it).

Names reach the socket only after the config validated them against ``NAME`` (no space, newline or ``;``, which
the runtime API would read as a command separator).
"""

from __future__ import annotations

import csv
import io
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from tuner.errors import ApplyError

__all__ = ["HAProxy", "ServerStat", "NAME", "haproxy_config"]

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,63}\Z")


@dataclass(frozen=True)
class ServerStat:
    backend: str
    server: str
    status: str  # UP | DOWN | DRAIN | MAINT | "DOWN 1/2" ...
    current: int  # sessions now (scur)
    queued: int  # requests queued for it (qcur)
    total: int  # sessions so far (stot)


class HAProxy:
    """One backend of one HAProxy, through its admin socket. ``clock``/``sleep`` are injectable for tests."""

    def __init__(
        self,
        socket_path: str,
        backend: str,
        *,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not NAME.match(backend):
            raise ValueError(f"HAProxy backend name {backend!r}: use letters, digits, '.', '_' or '-'")
        self.socket_path, self.backend, self.timeout_s = socket_path, backend, timeout_s
        self.clock, self.sleep = clock, sleep

    def command(self, cmd: str) -> str:
        """Send one runtime API command; its answer. ApplyError when the socket cannot be reached."""
        if "\n" in cmd or ";" in cmd:
            raise ValueError(f"one runtime API command at a time, got {cmd!r}")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout_s)
                s.connect(self.socket_path)
                s.sendall(cmd.encode() + b"\n")
                chunks = []
                while True:
                    data = s.recv(65536)
                    if not data:
                        break
                    chunks.append(data)
        except OSError as exc:
            raise ApplyError(
                f"HAProxy admin socket {self.socket_path}: {exc.strerror or exc} (is `stats socket "
                f"{self.socket_path} mode 600 level admin` in its global section?)"
            ) from None
        return b"".join(chunks).decode(errors="replace")

    def stats(self) -> dict[str, ServerStat]:
        """This backend's servers by name."""
        text = self.command("show stat")
        out: dict[str, ServerStat] = {}
        for row in csv.DictReader(io.StringIO(text.lstrip("# "))):
            if row.get("pxname") != self.backend or row.get("svname") in ("FRONTEND", "BACKEND", None):
                continue
            out[row["svname"]] = ServerStat(
                self.backend,
                row["svname"],
                row.get("status") or "",
                int(row.get("scur") or 0),
                int(row.get("qcur") or 0),
                int(row.get("stot") or 0),
            )
        if not out:
            raise ApplyError(f"HAProxy has no backend {self.backend!r} with servers (show stat)")
        return out

    def stat(self, server: str) -> ServerStat:
        stats = self.stats()
        if server not in stats:
            raise ApplyError(
                f"HAProxy backend {self.backend!r} has no server {server!r}; it has {', '.join(sorted(stats))}"
            )
        return stats[server]

    def set_state(self, server: str, state: str) -> None:
        if state not in ("ready", "drain", "maint") or not NAME.match(server):
            raise ValueError(f"set server {server!r} state {state!r}")
        answer = self.command(f"set server {self.backend}/{server} state {state}").strip()
        if answer:
            raise ApplyError(f"HAProxy refused `set server {self.backend}/{server} state {state}`: {answer}")

    def drain(self, server: str, timeout_s: float) -> tuple[bool, ServerStat]:
        """No new requests to ``server``; wait until it has no session and no queue. (drained, last stat)."""
        self.set_state(server, "drain")
        deadline = self.clock() + timeout_s
        while True:
            st = self.stat(server)
            if st.current == 0 and st.queued == 0:
                return True, st
            if self.clock() >= deadline:
                return False, st
            self.sleep(0.2)

    def ready(self, server: str, timeout_s: float) -> ServerStat:
        """Back in rotation; wait until HAProxy's own health check says UP (ApplyError if it does not)."""
        self.set_state(server, "ready")
        deadline = self.clock() + timeout_s
        while True:
            st = self.stat(server)
            if st.status == "UP":
                return st
            if self.clock() >= deadline:
                raise ApplyError(
                    f"HAProxy still reports {self.backend}/{server} {st.status!r} {timeout_s:g}s after "
                    "it was set ready (its health check does not pass)"
                )
            self.sleep(0.2)

    def add(self, server: str, host: str, port: int, *, check_interval_ms: int = 500) -> None:
        """A new server in the backend (HAProxy >= 2.5's dynamic servers), checked on /health like the others
        (a dynamic server inherits no default-server line, so the check's timing is given here) and enabled:
        traffic reaches it once its check says UP (wait with ``ready``)."""
        if not NAME.match(server) or not re.match(r"^[A-Za-z0-9.:\[\]-]+\Z", host) or not 0 < port < 65536:
            raise ValueError(f"add server {server!r} at {host!r}:{port!r}")
        answer = self.command(
            f"add server {self.backend}/{server} {host}:{port} check inter {check_interval_ms}ms fall 2 rise 2"
        ).strip()
        if "registered" not in answer.lower():
            raise ApplyError(
                f"HAProxy refused to add {self.backend}/{server} at {host}:{port}: {answer} (dynamic "
                "servers need HAProxy >= 2.5 and a balance algorithm that allows them, e.g. leastconn)"
            )
        for cmd in (f"enable health {self.backend}/{server}", f"enable server {self.backend}/{server}"):
            answer = self.command(cmd).strip()
            if answer:
                raise ApplyError(f"HAProxy refused `{cmd}`: {answer}")

    def remove(self, server: str) -> None:
        """Take a server out of the backend for good (it must be idle: drain it first)."""
        self.set_state(server, "maint")
        answer = self.command(f"del server {self.backend}/{server}").strip()
        if "deleted" not in answer.lower():
            raise ApplyError(f"HAProxy refused to delete {self.backend}/{server}: {answer}")

    def others_up(self, server: str) -> list[str]:
        """The backend's other servers that are UP (where traffic goes while ``server`` is out)."""
        return [name for name, st in self.stats().items() if name != server and st.status == "UP"]

    def wait_others_up(self, server: str, timeout_s: float) -> tuple[list[str], float]:
        """``others_up``, waiting up to ``timeout_s`` for one: a loaded replica's health check can miss twice and
        read DOWN for a few check intervals, then UP again. (the servers UP, seconds waited)."""
        start = self.clock()
        while True:
            up = self.others_up(server)
            waited = self.clock() - start
            if up or waited >= timeout_s:
                return up, waited
            self.sleep(0.2)


def haproxy_config(
    *, frontend: str, socket_path: str, backend: str, servers: list[tuple[str, str, int]], check_interval_ms: int = 500
) -> str:
    """The HAProxy config tuner expects in front of a replica group (docs/replica-groups.md): the admin socket at
    level admin, HTTP mode, a health check on /health so that a restarting replica is taken out by HAProxy too,
    and retries with redispatch so a connection refused by a replica that just stopped goes to another one.
    ``frontend``: HOST:PORT clients use; ``servers``: (name, host, port)."""
    for name, host, _ in servers:
        if not NAME.match(name) or not re.match(r"^[A-Za-z0-9.:\[\]-]+\Z", host):
            raise ValueError(f"server {name!r} at {host!r}: names are letters, digits, '.', '_' or '-'")
    lines = [
        "global",
        f"    stats socket {socket_path} mode 600 level admin",
        "    maxconn 2000",
        "defaults",
        "    mode http",
        "    timeout connect 2s",
        "    timeout client 300s",
        "    timeout server 300s",  # a long generation is one slow response
        "    timeout queue 60s",
        "    retries 3",
        "    option redispatch",
        f"frontend {backend}_in",
        f"    bind {frontend}",
        f"    default_backend {backend}",
        f"backend {backend}",
        "    balance leastconn",
        "    option httpchk GET /health",
        "    http-check expect status 200",
        f"    default-server inter {check_interval_ms}ms fall 2 rise 2",
        *(f"    server {name} {host}:{port} check" for name, host, port in servers),
    ]
    return "\n".join(lines) + "\n"
