"""tuner's HAProxy runtime-API client against a real HAProxy (Debian's package; scripts/install-haproxy.sh) in
front of two small stand-in HTTP servers (the replicas here only need to answer /health and hold a request open;
real llama-server replicas run in tests/integration/test_rolling_haproxy.py). Plus the config of replica groups.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import requests

from tuner.apply.balancer import HAProxy, haproxy_config
from tuner.apply.launch import free_port
from tuner.config import parse_config
from tuner.errors import ApplyError, ConfigError

# Answers /health; POST /slow?s=N holds the request N seconds. Counts nothing: HAProxy's own stats do.
SERVER = textwrap.dedent("""\
    import http.server, socketserver, sys, time, urllib.parse
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
        def do_POST(self):
            q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            time.sleep(float(q.get("s", ["0"])[0]))
            self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    class S(socketserver.ThreadingMixIn, http.server.HTTPServer): daemon_threads = True
    S(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def _haproxy() -> str:
    path = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
    if path is None:
        if os.environ.get("TUNER_REQUIRE_REAL_SERVERS") == "1":
            pytest.fail("haproxy not installed; run scripts/install-haproxy.sh")
        pytest.skip("haproxy not installed; run scripts/install-haproxy.sh")
    return path


def _wait(cond, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


@pytest.fixture
def replicas(tmp_path):  # type: ignore[no-untyped-def]
    """HAProxy in front of r1 and r2: (client, frontend URL, {name: port}, {name: process}); a test may stop and
    restart a replica's process (on its port) to flap HAProxy's check."""
    exe = _haproxy()
    (tmp_path / "server.py").write_text(SERVER)
    ports = {"r1": free_port(), "r2": free_port()}
    servers = {n: subprocess.Popen([sys.executable, str(tmp_path / "server.py"), str(p)]) for n, p in ports.items()}
    front = free_port()
    sock = str(tmp_path / "admin.sock")
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(
        haproxy_config(
            frontend=f"127.0.0.1:{front}",
            socket_path=sock,
            backend="chat",
            servers=[(n, "127.0.0.1", p) for n, p in ports.items()],
            check_interval_ms=200,
        )
    )
    check = subprocess.run([exe, "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr  # the config tuner documents is one HAProxy takes
    proc = subprocess.Popen([exe, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    h = HAProxy(sock, "chat")
    try:
        _wait(lambda: Path(sock).exists() and all(s.status == "UP" for s in h.stats().values()))
        yield h, f"http://127.0.0.1:{front}", ports, servers
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for s in servers.values():
            s.terminate()
            s.wait(timeout=10)


@pytest.fixture
def lb(replicas):  # type: ignore[no-untyped-def]
    h, url, _, _ = replicas
    return h, url


def _post(url: str, seconds: float = 0.0) -> int:
    return requests.post(
        f"{url}/slow?s={seconds}", timeout=30, proxies={"http": ""}, headers={"Connection": "close"}
    ).status_code


def test_drain_sends_nothing_new_waits_for_the_open_request_and_ready_brings_it_back(lb):
    h, url = lb
    assert set(h.stats()) == {"r1", "r2"} and h.others_up("r1") == ["r2"]
    # a slow request is on one of them; drain that one
    slow = threading.Thread(target=_post, args=(url, 2.0))
    slow.start()
    _wait(lambda: any(s.current == 1 for s in h.stats().values()), 5)
    busy = next(n for n, s in h.stats().items() if s.current == 1)
    other = "r2" if busy == "r1" else "r1"
    t0 = time.monotonic()
    drained, st = h.drain(busy, timeout_s=10)
    waited = time.monotonic() - t0
    slow.join()
    assert drained and st.current == 0 and st.status == "DRAIN"
    assert waited > 1.0  # it waited for the open request (2 s, started just before)
    before = {n: s.total for n, s in h.stats().items()}
    assert all(_post(url) == 200 for _ in range(10))
    after = {n: s.total for n, s in h.stats().items()}
    assert after[busy] == before[busy] and after[other] == before[other] + 10  # nothing new to the drained one
    assert h.ready(busy, timeout_s=10).status == "UP"
    assert all(_post(url) == 200 for _ in range(10))
    assert h.stats()[busy].total > after[busy]  # back in rotation


def test_waiting_for_a_peer_rides_out_a_check_that_flaps_and_gives_up_at_its_bound(replicas, tmp_path):
    """The 11-30 CI flake: under load a replica's check read not-UP for an instant and a rolling apply refused to
    drain the other one. Here r2's process stops (its check fails, HAProxy marks it DOWN) and comes back on its
    port: waiting for a peer returns r2 once HAProxy's own check says UP again, and says how long it waited."""
    h, _, ports, servers = replicas
    servers["r2"].terminate()
    servers["r2"].wait(timeout=10)
    _wait(lambda: h.stats()["r2"].status != "UP", 10)
    assert h.others_up("r1") == []  # the one-shot check the apply used to make
    up, waited = h.wait_others_up("r1", timeout_s=0.5)  # nobody brings r2 back: it gives up at its bound
    assert up == [] and waited >= 0.5
    servers["r2"] = subprocess.Popen([sys.executable, str(tmp_path / "server.py"), str(ports["r2"])])
    up, waited = h.wait_others_up("r1", timeout_s=20)
    assert up == ["r2"] and h.stats()["r2"].status == "UP"
    assert 0 < waited < 20  # r2 was not UP when it started: rise 2 at a 200-ms interval takes at least 0.2 s


def test_a_drain_that_does_not_finish_in_time_says_so(lb):
    h, url = lb
    slow = threading.Thread(target=_post, args=(url, 3.0))
    slow.start()
    _wait(lambda: any(s.current == 1 for s in h.stats().values()), 5)
    busy = next(n for n, s in h.stats().items() if s.current == 1)
    drained, st = h.drain(busy, timeout_s=0.5)
    assert not drained and st.current == 1
    slow.join()
    h.ready(busy, timeout_s=10)


def test_errors_name_what_to_fix(lb, tmp_path):
    h, _ = lb
    with pytest.raises(ApplyError, match="has no server 'r9'; it has r1, r2"):
        h.stat("r9")
    with pytest.raises(ValueError):
        h.set_state("r1; shutdown", "drain")  # a name never carries a second command to the socket
    with pytest.raises(ValueError):
        h.command("show stat\nshutdown sessions")
    with pytest.raises(ApplyError, match="nope.sock.*level admin"):
        HAProxy(str(tmp_path / "nope.sock"), "chat").stats()
    with pytest.raises(ApplyError, match="no backend 'other'"):
        HAProxy(h.socket_path, "other").stats()


@pytest.mark.parametrize(
    "replicas,balancer,key",
    [
        ("[{name: r1, url: 'http://127.0.0.1:1'}, {name: r2, url: 'http://127.0.0.1:2'}]", None, "targets[0]"),
        ("[{name: r1, url: 'http://127.0.0.1:1'}]", "{socket: /s, backend: b}", "targets[0]"),
        (
            "[{name: r1, url: 'http://127.0.0.1:1'}, {name: r1, url: 'http://127.0.0.1:2'}]",
            "{socket: /s, backend: b}",
            "targets[0]",
        ),
        (
            "[{name: 'r 1', url: 'http://127.0.0.1:1'}, {name: r2, url: 'http://127.0.0.1:2'}]",
            "{socket: /s, backend: b}",
            "targets[0].replicas[0].name",
        ),
        (
            "[{name: r1, url: 'http://127.0.0.1'}, {name: r2, url: 'http://127.0.0.1:2'}]",
            "{socket: /s, backend: b}",
            "targets[0].replicas[0].url",
        ),
        (
            "[{name: r1, url: 'http://127.0.0.1:1'}, {name: r2, url: 'http://127.0.0.1:2'}]",
            "{socket: /s, backend: 'b;x'}",
            "targets[0].balancer.backend",
        ),
        ("[]", "{socket: /s, backend: b}", "targets[0]"),  # one server behind a balancer: blue/green needs its name
        ("[]", "{socket: /s, backend: b, server: blue}", "targets[0]"),  # ... and a managed target (no managed here)
        ("[]", "{socket: /s, backend: b, server: 'blue;x'}", "targets[0].balancer.server"),
        ("[]", "{socket: /s, backend: b, server: blue, frontend: 'nohost'}", "targets[0].balancer.frontend"),
    ],
)
def test_a_bad_group_is_rejected_with_its_key(replicas, balancer, key):
    text = (
        "targets:\n  - name: chat\n    backend: llamacpp\n    url: http://127.0.0.1:8080\n"
        f"    replicas: {replicas}\n" + (f"    balancer: {balancer}\n" if balancer else "")
    )
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert err.value.key.startswith(key), (err.value.key, str(err.value))


def test_a_group_is_one_target_per_replica_sharing_everything_but_the_url():
    cfg = parse_config(
        "targets:\n  - name: chat\n    backend: llamacpp\n    url: http://127.0.0.1:8080\n"
        "    balancer: {socket: /run/h.sock, backend: chat}\n    slo: {e2e_p99: 4s}\n"
        "    replicas: [{name: a, url: 'http://127.0.0.1:8001'}, {name: b, url: 'http://127.0.0.1:8002'}]\n"
    )
    a, b = cfg.targets
    assert (a.name, a.url, a.replica, b.name, b.url) == (
        "chat.a",
        "http://127.0.0.1:8001",
        "a",
        "chat.b",
        "http://127.0.0.1:8002",
    )
    assert a.group == b.group == "chat" and a.group_url == "http://127.0.0.1:8080" and a.slo == b.slo
    assert cfg.group(a) == [a, b] and a.labels == {"group": "chat", "replica": "a"}
    from tuner.app.apply import haproxy_config_for

    text = haproxy_config_for(cfg, "chat")
    assert "bind 127.0.0.1:8080" in text and "server a 127.0.0.1:8001 check" in text and "/run/h.sock" in text
    with pytest.raises(ConfigError, match="there are: chat"):
        haproxy_config_for(cfg, "nope")


def test_a_replica_has_environment_variables_of_its_own_over_the_groups(tmp_path):
    (tmp_path / "m").mkdir()
    cfg = parse_config(
        "targets:\n  - name: chat\n    backend: vllm\n    url: http://127.0.0.1:8080\n"
        "    balancer: {socket: /run/h.sock, backend: chat}\n"
        f"    managed: {{model: '{tmp_path / 'm'}', env: {{A: '1', B: '2'}}}}\n"
        "    replicas: [{name: a, url: 'http://127.0.0.1:8001', env: {B: '3', CUDA_VISIBLE_DEVICES: '1'}},"
        " {name: b, url: 'http://127.0.0.1:8002'}]\n"
    )
    a, b = cfg.targets
    assert a.managed is not None and b.managed is not None
    assert a.managed.env == {"A": "1", "B": "3", "CUDA_VISIBLE_DEVICES": "1"} and b.managed.env == {"A": "1", "B": "2"}
    assert a.served_name == b.served_name == "chat"  # clients through the balancer ask every replica for one name


def test_blue_green_is_one_managed_target_with_its_server_name_and_its_haproxy_config(tmp_path):
    (tmp_path / "m").mkdir()
    text = (
        "targets:\n  - name: chat\n    backend: llamacpp\n    url: http://127.0.0.1:8001\n"
        f"    managed: {{model: '{tmp_path / 'm'}'}}\n"
        "    balancer: {socket: /run/h.sock, backend: chat, server: blue, frontend: '127.0.0.1:8080'}\n"
    )
    cfg = parse_config(text)
    (t,) = cfg.targets
    from tuner.app.apply import haproxy_config_for
    from tuner.apply.routes import ROUTES, BlueGreen, route_for

    assert route_for(t) is ROUTES["blue_green"] and t.group is None and cfg.group(t) == [t]
    out = haproxy_config_for(cfg, "chat")
    assert "bind 127.0.0.1:8080" in out and "server blue 127.0.0.1:8001 check" in out and "leastconn" in out
    spare = BlueGreen.spare(t, 9000)  # same model name for clients, its own name, log and port
    assert (spare.name, spare.url, spare.replica) == ("chat~spare", "http://127.0.0.1:9000", "blue-spare")
    assert spare.managed is not None and spare.managed.served_model_name == "chat"
    with pytest.raises(ConfigError) as err:
        haproxy_config_for(parse_config(text.replace(", frontend: '127.0.0.1:8080'", "")), "chat")
    assert err.value.key == "targets[chat].balancer.frontend"


def test_a_dynamic_server_joins_the_backend_checked_and_leaves_it(lb, tmp_path):
    h, url = lb
    port = free_port()
    spare = subprocess.Popen([sys.executable, str(tmp_path / "server.py"), str(port)])
    try:
        h.add("spare", "127.0.0.1", port, check_interval_ms=200)
        assert h.ready("spare", timeout_s=10).status == "UP"  # HAProxy's own check passed
        for name in ("r1", "r2"):
            h.drain(name, timeout_s=5)
        before = h.stat("spare").total
        assert all(_post(url) == 200 for _ in range(5)) and h.stat("spare").total == before + 5  # it serves
        for name in ("r1", "r2"):
            h.ready(name, timeout_s=10)
        h.drain("spare", timeout_s=5)
        h.remove("spare")
        assert set(h.stats()) == {"r1", "r2"}
        with pytest.raises(ApplyError, match="refused to add"):
            h.add("r1", "127.0.0.1", port)  # a name the backend has
        with pytest.raises(ValueError):
            h.add("x; shutdown", "127.0.0.1", port)
    finally:
        spare.terminate()
        spare.wait(timeout=10)
