"""Every apply route (tuner/apply/routes.py) against the same contract, and the hook route through a real switch.

The managed route's real switches run in tests/integration (vLLM and llama-server); the systemd route's in
tests/apply/test_managed_config.py (no systemd on these machines: the drop-in is written, systemctl is missing).
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tuner.apply.flow import Applier
from tuner.apply.launch import free_port
from tuner.apply.routes import ROUTES, route_for
from tuner.collect import http
from tuner.config import parse_config
from tuner.errors import ApplyError, ServerStartError
from tuner.store import journal as jr
from tuner.store import recommendations as recs

# A stand-in server: the hook starts it on the target's port; it answers /health and a completion, as vLLM does.
SERVER = textwrap.dedent("""\
    import http.server, json, sys
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0); self.rfile.read(n)
            body = json.dumps({"choices": [{"text": " hi"}], "flags": sys.argv[2:]}).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")
# The hook: stop the server it started last (pid file), start it again with the flags it was given.
HOOK = textwrap.dedent("""\
    import os, signal, subprocess, sys, time
    pidfile, server, port, flags = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    if os.path.exists(pidfile):
        old = int(open(pidfile).read())
        try:
            os.kill(old, signal.SIGTERM)
            for _ in range(100):  # until it has let go of the port
                os.kill(old, 0)
                time.sleep(0.05)
        except ProcessLookupError:
            pass
    p = subprocess.Popen([sys.executable, server, port, *flags], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    open(pidfile, "w").write(str(p.pid))
""")


def _config(tmp_path: Path, route: str, port: int = 9, apply_extra: str = "") -> str:
    head = f"targets:\n  - name: t\n    backend: vllm\n    url: http://127.0.0.1:{port}\n"
    if route == "rolling":
        (tmp_path / "model").mkdir(exist_ok=True)
        return head + (
            f"    balancer: {{socket: '{tmp_path / 'haproxy.sock'}', backend: t}}\n"
            "    replicas: [{name: r1, url: 'http://127.0.0.1:9'}, {name: r2, url: 'http://127.0.0.1:10'}]\n"
            f"    managed: {{model: '{tmp_path / 'model'}', flags: {{max_num_seqs: 4}}}}\n"
        )
    if route == "blue_green":
        (tmp_path / "model").mkdir(exist_ok=True)
        return head + (
            f"    balancer: {{socket: '{tmp_path / 'haproxy.sock'}', backend: t, server: blue}}\n"
            f"    managed: {{model: '{tmp_path / 'model'}', flags: {{max_num_seqs: 4}}}}\n"
        )
    if route == "managed":
        (tmp_path / "model").mkdir(exist_ok=True)
        return head + f"    managed: {{model: '{tmp_path / 'model'}', flags: {{max_num_seqs: 4}}}}\n"
    head += "    flags: {max-num-seqs: 4}\n"
    if route == "kubernetes":
        return head + "    kubernetes: {namespace: llm, name: chat, container: vllm}\n"
    if route == "hook":
        return head + (
            f"    apply: {{hook: {{command: ['{sys.executable}', '{tmp_path / 'hook.py'}', "
            f"'{tmp_path / 'server.pid'}', '{tmp_path / 'server.py'}', '{port}', '{{flags}}']}}"
            f"{apply_extra}}}\n"
        )
    if route == "systemd":
        return head + (
            f"    apply: {{hook: {{systemd_unit: vllm.service, systemd_dropin: '{tmp_path / 'tuner-flags.conf'}'}}}}\n"
        )
    return head


EVERY = pytest.mark.parametrize("name", list(ROUTES))


@EVERY
def test_each_route_is_chosen_by_its_config_and_plans_the_same_diff(tmp_path, store, name):
    cfg = parse_config(_config(tmp_path, name))
    t = cfg.targets[0]
    route = route_for(t)
    assert route is ROUTES[name]
    ap = Applier(cfg, store, tmp_path, say=lambda m: None)
    p = ap.plan_diff(t, {"max_num_seqs": 8})
    assert p.route is route and (p.old_flags, p.new_flags) == ({"max_num_seqs": 4}, {"max_num_seqs": 8})
    # tuner restarts the server itself on every route but by hand
    assert route.restarts == (name != "manual")
    described = ap.describe(p)
    assert "max_num_seqs: 4 -> 8" in described
    # the dry run shows what will run with the new value: an argv, a drop-in, or the flags to set by hand
    shown = described.splitlines()[-1]
    assert ("--max-num-seqs" in shown and "8" in shown) or (
        name == "systemd" and "TUNER_FLAGS=--max-num-seqs 8" in shown
    ), described
    if name != "systemd":  # a unit restart's argv has no flags: the drop-in carries them
        assert "8" in p.new_argv and "4" in p.old_argv and "--max-num-seqs" in p.new_argv
    # a failure is told in one line; only the managed route reads the server's log (and the in-flight count)
    exc = ServerStartError("not healthy after 5s\nmore", None, [])
    assert route.why_failed(ap, t, exc) == "not healthy after 5s"
    if name not in ("managed", "rolling", "blue_green"):
        assert route.in_flight(ap, t) is None
        route.settle(ap, 1, t)  # nothing in a balancer to settle: no call reaches anything
    # clients go unserved while the server switches, except by hand and behind a balancer
    assert route.outage == (name not in ("manual", "rolling", "blue_green", "kubernetes"))


def test_by_hand_never_switches_and_never_restores(tmp_path, store):
    cfg = parse_config(_config(tmp_path, "manual"))
    ap = Applier(cfg, store, tmp_path, say=lambda m: None)
    p = ap.plan_diff(cfg.targets[0], {"max_num_seqs": 8})
    with pytest.raises(ApplyError, match="restart it by hand with --max-num-seqs 8"):
        p.route.switch(ap, 0, p, p.new_flags, p.diff)
    assert p.route.restore(ap, 0, p) is False


def test_the_hook_route_switches_a_real_server_and_observes_it(tmp_path, store):
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "hook.py").write_text(HOOK)
    port = free_port()
    cfg = parse_config(_config(tmp_path, "hook", port, apply_extra=", observe: 1s, baseline: 1s"))
    ap = Applier(cfg, store, tmp_path, say=lambda m: None)
    rid = recs.add_recommendation(
        store.engine,
        target="t",
        now=time.time(),
        rules=["r"],
        diff_key="{}",
        diff={"max_num_seqs": 8},
        current={},
        evidence=[],
        expected_effect="",
        risk="",
        confidence=0.9,
        rank=1,
        memory_check={"ok": True},
    )
    try:
        a = ap.apply(rid)
        steps = [s["step"] for s in a.steps]
        # the hook ran with the new flags, the real server it started passed the health gate, tuner observed it
        assert steps[:6] == ["planned", "baseline", "starting", "hook", "health_check", "healthy"], steps
        hook_step = next(s for s in a.steps if s["step"] == "hook")
        assert '"--max-num-seqs", "8"' in hook_step["detail"]
        assert "observing" in steps and a.state == "done"
        # never scraped: nothing to judge with, so the verdict is inconclusive and (apply.on_inconclusive:
        # keep_previous) the previous flags go back through the same hook and the same gate
        assert a.outcome == "inconclusive" and "too little traffic" in a.note, a.note
        assert steps[steps.index("restoring") :] == ["restoring", "hook", "restored", "done: inconclusive"], steps
        answer = http.post_json(f"http://127.0.0.1:{port}/v1/completions", {"prompt": "x"}, timeout_s=10)
        assert json.loads(answer.body)["flags"] == ["--max-num-seqs", "4"]  # the server runs the old flags again
        assert jr.open_applies(store.engine) == []
    finally:
        pidfile = tmp_path / "server.pid"
        if pidfile.exists():
            import os
            import signal

            try:
                os.kill(int(pidfile.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass


def test_a_canary_needs_a_group_behind_a_balancer(tmp_path, store):
    cfg = parse_config(_config(tmp_path, "managed"))
    ap = Applier(cfg, store, tmp_path, say=lambda m: None)
    rid = recs.add_recommendation(
        store.engine,
        target="t",
        now=time.time(),
        rules=["r"],
        diff_key="{}",
        diff={"max_num_seqs": 8},
        current={},
        evidence=[],
        expected_effect="",
        risk="",
        confidence=0.9,
        rank=1,
        memory_check={"ok": True},
    )
    with pytest.raises(ApplyError, match="a canary needs peers serving the same traffic"):
        ap.canary(rid)
    assert jr.open_applies(store.engine) == [] and jr.list_applies(store.engine) == []  # nothing begun
