"""Bad input at the command line (issue 39, items 6-8): one line naming the file, key or value, the exit code of
its error class, never a traceback; files read no further than their cap."""

from __future__ import annotations

import gzip
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import FIXTURES

VERDICT = FIXTURES / "verdict" / "fewer_seqs"


def tuner(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, timeout=120, **kw)


def one_line(proc: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    """The command failed with ``code`` and said so in one line holding every fragment."""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def _config(tmp_path: Path, extra: str = "") -> Path:
    cfg = tmp_path / "tuner.yaml"
    cfg.write_text(
        f"store: {{url: 'sqlite:///{tmp_path}/tuner.db'}}\n"
        f"targets:\n  - {{name: chat, backend: vllm, url: 'http://127.0.0.1:1'}}\n{extra}"
    )
    return cfg


# ---- item 6: a NaN threshold ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["alerts", "check"], ["alerts", "export"]])
def test_a_nan_threshold_is_refused_by_check_and_export_naming_the_rule(tmp_path, command):
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n  - name: g\n    rules:\n      - {alert: KVHigh, signal: kv_cache_usage, op: '>', threshold: .nan}\n"
    )
    one_line(tuner(*command, "--files", str(rules)), 2, f"{rules}:4:", "KVHigh: threshold must be a finite number")


# ---- item 7: tracebacks instead of one line ------------------------------------------------------------------------


def test_a_config_that_is_not_utf8_is_one_line(tmp_path):
    cfg = tmp_path / "tuner.yaml"
    cfg.write_bytes("targets: []\n# caf\xe9\n".encode("latin-1"))
    one_line(tuner("--config", str(cfg), "status"), 2, str(cfg), "not UTF-8", "line 2")


def test_a_workload_file_that_is_not_utf8_is_one_line(tmp_path):
    cfg = tmp_path / "tuner.yaml"
    cfg.write_text(
        f"store: {{url: 'sqlite:///{tmp_path}/tuner.db'}}\n"
        "targets:\n  - {name: chat, backend: vllm, url: 'http://127.0.0.1:1', slo: {ttft_p99: 1s},\n"
        "     managed: {model: /nonexistent/model}}\n"
    )
    assert tuner("--config", str(cfg), "db", "upgrade").returncode == 0
    workload = tmp_path / "w.yaml"
    workload.write_bytes(b"input_len: 100\noutput_len: 10 # \xff\n")
    one_line(tuner("--config", str(cfg), "tune", "chat", "--workload", str(workload)), 2, str(workload), "not UTF-8")


def test_an_alert_scenario_that_is_not_utf8_is_one_line(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_bytes(b"rules: [r.yaml]\n# \xff\n")
    one_line(tuner("alerts", "test", str(scenario)), 2, str(scenario), "not UTF-8")


def test_a_token_file_that_is_not_utf8_is_one_line(tmp_path):
    token = tmp_path / "token"
    token.write_bytes(b"\xfe" * 40)
    cfg = _config(tmp_path, f"listen: 127.0.0.1:0\napi: {{token_file: '{token}'}}\n")
    assert tuner("--config", str(cfg), "db", "upgrade").returncode == 0
    one_line(tuner("--config", str(cfg), "run", "--for", "1s"), 2, "api.token_file", str(token), "not UTF-8")


def test_a_short_token_in_the_environment_is_refused_as_a_short_token_file_is(tmp_path):
    import os

    cfg = _config(tmp_path, "listen: 127.0.0.1:0\n")
    assert tuner("--config", str(cfg), "db", "upgrade").returncode == 0
    one_line(
        tuner("--config", str(cfg), "run", "--for", "1s", env={**os.environ, "TUNER_API_TOKEN": "x"}),
        2,
        "TUNER_API_TOKEN",
        "at least 16 characters",
    )


def test_listen_on_ipv6_serves_and_a_bare_ipv6_host_is_refused(tmp_path):
    import urllib.request

    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        port = s.getsockname()[1]
    cfg = _config(tmp_path, f"listen: '[::1]:{port}'\ndefaults: {{scrape_interval: 1s}}\n")
    assert tuner("--config", str(cfg), "db", "upgrade").returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "--config", str(cfg), "run"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        from tuner.lab.proc import wait_for

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"http://[::1]:{port}/metrics", timeout=2) as r:
                    # running for two scrapes: a SIGTERM in its first milliseconds meets an APScheduler race
                    text = r.read().decode()
                return any(
                    line.startswith('tuner_scrapes_total{target="chat"}') and float(line.split()[-1]) >= 2
                    for line in text.splitlines()
                )
            except OSError:
                return proc.poll() is not None  # it died: stop waiting, the assertion below says why

        wait_for(answers, 60, "tuner's /metrics on [::1]")
        assert proc.poll() is None
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err and proc.returncode == 0, err

    bare = _config(tmp_path, f"listen: '::1:{port}'\n")
    one_line(tuner("--config", str(bare), "status"), 2, "listen", "IPv6 address in brackets")


def test_a_listen_port_in_use_is_one_line_naming_the_port_and_the_key(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cfg = _config(tmp_path, f"listen: 127.0.0.1:{port}\n")
        assert tuner("--config", str(cfg), "db", "upgrade").returncode == 0
        one_line(tuner("--config", str(cfg), "run", "--for", "5s"), 2, "listen", f"127.0.0.1:{port}", "in use")


def _dirs(tmp_path: Path) -> tuple[Path, Path]:
    before, after = tmp_path / "before", tmp_path / "after"
    shutil.copytree(VERDICT / "before", before)
    shutil.copytree(VERDICT / "after", after)
    return before, after


def _judge(before: Path, after: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return tuner("judge", "--before", str(before), "--after", str(after), "--backend", "vllm", "--json", *more)


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_judge_of_a_truncated_or_corrupt_gzip_exits_3_naming_the_file(tmp_path, damage):
    before, after = _dirs(tmp_path)
    victim = sorted(after.glob("*.txt.gz"))[2]
    raw = victim.read_bytes()
    victim.write_bytes(raw[: len(raw) // 2] if damage == "truncated" else raw[:20] + b"\x00" * 64 + raw[84:])
    one_line(_judge(before, after), 3, str(victim))


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["signals", "chat", "--at", "nan"], "--at: expected unix seconds from 0"),
        (["signals", "chat", "--at", "1e30"], "--at: expected unix seconds from 0"),
        (["recommendations", "show", "9" * 20], "id: expected a whole number from 1 to"),
        (["apply-recommendation", "9" * 20, "--yes"], "id: expected a whole number from 1 to"),
        (["journal", "--limit", "9" * 20], "--limit: expected a whole number from 1 to"),
        (["report", "--until", "inf"], "--until: expected unix seconds"),
        (
            ["plan", "--model", str(FIXTURES / "models" / "llama-3-8b"), "--gpu-memory-gib", "inf"],
            "--gpu-memory-gib: expected a number above 0",
        ),
        (
            ["plan", "--model", str(FIXTURES / "models" / "llama-3-8b"), "--gpu-memory-gib", "nan"],
            "--gpu-memory-gib: expected a number above 0",
        ),
        (
            ["judge", "--before", "a", "--after", "b", "--backend", "vllm", "--slo-ttft-p99", "soon"],
            "--slo-ttft-p99: expected a duration",
        ),
    ],
)
def test_bad_numbers_on_the_command_line_are_refused_by_name(tmp_path, args, fragment):
    cfg = _config(tmp_path)
    assert tuner("--config", str(cfg), "db", "upgrade").returncode == 0
    proc = tuner("--config", str(cfg), *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, proc.stderr
    assert fragment in proc.stderr.strip().splitlines()[-1], proc.stderr


# ---- item 8: unbounded reads -------------------------------------------------------------------------------------


def _bounded() -> None:
    """The command's address space, capped: a read that does not stop ends in MemoryError (the review's
    `snapshot --file /dev/zero` grew to 23.7 GB), not in the machine's OOM killer."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))


def test_snapshot_of_dev_zero_stops_at_the_cap(tmp_path):
    proc = tuner("snapshot", "--file", "/dev/zero", "--backend", "vllm", "--max-bytes", "1048576", preexec_fn=_bounded)
    one_line(proc, 4, "/dev/zero", "larger than 1048576 bytes")


@pytest.mark.parametrize("flag, cap", [("--help-file", "10485760"), ("--startup-log", "20000")])
def test_recommend_reads_its_files_up_to_a_cap(tmp_path, flag, cap):
    cfg = _config(tmp_path)
    assert tuner("--config", str(cfg), "db", "upgrade").returncode == 0
    proc = tuner("--config", str(cfg), "recommend", "chat", flag, "/dev/zero", preexec_fn=_bounded)
    one_line(proc, 2, flag, "/dev/zero", f"larger than {cap} bytes")
    log = tmp_path / "start.log"  # a long log: its tail is read, not refused
    log.write_bytes(b"x" * 3 * 2**20 + b"\nCUDA out of memory\n")
    assert "Traceback" not in tuner("--config", str(cfg), "recommend", "chat", "--startup-log", str(log)).stderr


def test_judge_refuses_an_exposition_that_decompresses_past_the_cap(tmp_path):
    """A 40 MiB body in a ~40 KiB gzip (before: decompressed whole, 3.9 MB became 4 GB in the review)."""
    before, after = _dirs(tmp_path)
    victim = sorted(after.glob("*.txt.gz"))[1]
    with gzip.open(victim, "wb") as f:
        for _ in range(40):
            f.write(b"#" * 2**20)
    assert victim.stat().st_size < 200_000
    one_line(_judge(before, after), 3, str(victim), "decompresses to more than 10485760 bytes")
    # a cap the caller raises is honoured (the body is then read, and fails as an exposition instead)
    assert "decompresses" not in _judge(before, after, "--max-bytes", str(64 * 2**20)).stderr
