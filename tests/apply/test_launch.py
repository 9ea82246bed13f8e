"""Unit tests for tuner.apply.launch: argv rendering and validation, env, and process supervision."""

from __future__ import annotations

import socket
import sys
import time

import pytest

from tuner.apply.launch import ServerProcess, ServerStartError, free_port, llama_server_argv, vllm_argv, vllm_cpu_env

VLLM_HEAD = [
    "py",
    "-m",
    "vllm.entrypoints.openai.api_server",
    "--model",
    "/models/tiny",
    "--host",
    "127.0.0.1",
    "--port",
    "8000",
]


def test_vllm_argv_fixed_part_and_served_name():
    argv = vllm_argv("py", "/models/tiny", port=8000, served_model_name="tiny-llama", flags={})
    assert argv == VLLM_HEAD + ["--served-model-name", "tiny-llama"]


@pytest.mark.parametrize(
    ("flags", "rendered"),
    [
        ({"max-num-seqs": 8}, ["--max-num-seqs", "8"]),
        ({"gpu-memory-utilization": 0.3}, ["--gpu-memory-utilization", "0.3"]),
        ({"kv-cache-dtype": "fp8"}, ["--kv-cache-dtype", "fp8"]),
        ({"enforce-eager": True}, ["--enforce-eager"]),
        ({"enable-prefix-caching": False}, ["--no-enable-prefix-caching"]),
        ({"block-size": None}, []),
        ({"max-model-len": 1024, "max-num-seqs": 8}, ["--max-model-len", "1024", "--max-num-seqs", "8"]),
    ],
)
def test_vllm_flag_rendering(flags, rendered):
    assert vllm_argv("py", "/models/tiny", port=8000, served_model_name=None, flags=flags) == VLLM_HEAD + rendered


@pytest.mark.parametrize(
    "name",
    ["--max-num-seqs", "-x", "Max-Num-Seqs", "max_num_seqs", "max num seqs", "", "-", "a;b", "max-num-seqs=4", "é"],
)
def test_vllm_rejects_bad_flag_names(name):
    with pytest.raises(ValueError, match="flag"):
        vllm_argv("py", "/m", port=8000, flags={name: 1})


@pytest.mark.parametrize("value", ["-1", "--enforce-eager", -1, -0.5, ""])
def test_vllm_rejects_values_that_read_as_options(value):
    with pytest.raises(ValueError, match="max-num-seqs"):
        vllm_argv("py", "/m", port=8000, flags={"max-num-seqs": value})


@pytest.mark.parametrize("name", ["model", "host", "port", "served-model-name"])
def test_vllm_rejects_flags_owned_by_arguments(name):
    with pytest.raises(ValueError, match=name):
        vllm_argv("py", "/m", port=8000, flags={name: "x"})


@pytest.mark.parametrize("port", [0, 70000, "8000", True])
def test_rejects_bad_ports(port):
    with pytest.raises(ValueError, match="port"):
        vllm_argv("py", "/m", port=port)


def test_rejects_unsupported_value_types():
    with pytest.raises(ValueError, match="unsupported"):
        vllm_argv("py", "/m", port=8000, flags={"max-num-seqs": [8]})


def test_llama_server_argv_renders_dashed_keys():
    argv = llama_server_argv(
        "/bin/llama-server",
        "/m/tiny.gguf",
        port=9000,
        flags={"-c": 1024, "--parallel": 4, "--metrics": True, "-t": 1, "--mmap": False, "-ngl": None},
    )
    assert argv == [
        "/bin/llama-server",
        "-m",
        "/m/tiny.gguf",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "-c",
        "1024",
        "--parallel",
        "4",
        "--metrics",
        "-t",
        "1",
        "--no-mmap",
    ]


@pytest.mark.parametrize("name", ["c", "parallel", "---c", "--Parallel", "-C x", "--", "--a_b", "-m", "--port"])
def test_llama_server_rejects_bad_or_reserved_names(name):
    with pytest.raises(ValueError, match="flag"):
        llama_server_argv("/bin/llama-server", "/m.gguf", port=9000, flags={name: 1})


def test_llama_server_short_flag_false_has_no_negation():
    with pytest.raises(ValueError, match="short flag"):
        llama_server_argv("/bin/llama-server", "/m.gguf", port=9000, flags={"-fa": False})


def test_llama_server_rejects_values_starting_with_dash():
    with pytest.raises(ValueError, match="-ngl"):
        llama_server_argv("/bin/llama-server", "/m.gguf", port=9000, flags={"-ngl": -1})


def test_model_path_that_reads_as_option_is_rejected():
    with pytest.raises(ValueError):
        llama_server_argv("/bin/llama-server", "--help", port=9000)


def test_vllm_cpu_env_whole_gib_only(tmp_path):
    env = vllm_cpu_env(tmp_path, kvcache_space_gib=2, base={"PATH": "/usr/bin"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path)
    assert env["PATH"] == "/usr/bin"
    assert "VLLM_CPU_KVCACHE_SPACE" not in vllm_cpu_env(
        tmp_path, kvcache_space_gib=None, base={"VLLM_CPU_KVCACHE_SPACE": "4"}
    )
    for bad in (0, 0.5, "", True):
        with pytest.raises(ValueError, match="whole number"):
            vllm_cpu_env(tmp_path, kvcache_space_gib=bad)


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket() as s:  # free means this process can take it on 127.0.0.1 right now
        s.bind(("127.0.0.1", port))
        assert s.getsockname()[1] == port


def test_server_process_exit_before_healthy_reports_log_tail(tmp_path):
    argv = [sys.executable, "-c", "import sys; print('boom: no model'); sys.exit(3)"]
    proc = ServerProcess.start(argv, env=None, log_path=tmp_path / "s.log")
    with pytest.raises(ServerStartError, match="boom: no model") as err:
        proc.wait_healthy(f"http://127.0.0.1:{free_port()}", timeout=10)
    assert "code 3" in str(err.value)
    assert proc.stop() == 3


def test_server_process_health_and_stop(tmp_path):
    port = free_port()
    server = (
        "import http.server, sys\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200 if self.path == '/health' else 404); self.end_headers()\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    )
    with ServerProcess.start([sys.executable, "-c", server], env=None, log_path=tmp_path / "s.log") as proc:
        assert proc.wait_healthy(f"http://127.0.0.1:{port}", timeout=15) < 15
        assert proc.is_running()
    assert proc.returncode is not None


def test_server_process_escalates_when_sigterm_is_ignored(tmp_path):
    # Ignores SIGTERM and SIGINT like a server waiting for clients: only the final SIGKILL ends it.
    code = (
        "import signal, time\nfor s in (signal.SIGTERM, signal.SIGINT): signal.signal(s, signal.SIG_IGN)\n"
        "print('ready', flush=True)\ntime.sleep(60)\n"
    )
    proc = ServerProcess.start([sys.executable, "-c", code], env=None, log_path=tmp_path / "s.log")
    deadline = time.monotonic() + 10
    while "ready" not in proc.log_tail() and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    assert proc.stop(grace_s=0.5) == -9
    assert time.monotonic() - t0 < 5


def test_server_process_timeout_names_the_health_url(tmp_path):
    proc = ServerProcess.start(
        [sys.executable, "-c", "import time; time.sleep(30)"], env=None, log_path=tmp_path / "s.log"
    )
    try:
        with pytest.raises(ServerStartError, match="not healthy after"):
            proc.wait_healthy(f"http://127.0.0.1:{free_port()}", timeout=0.5)
    finally:
        proc.stop(grace_s=2)
