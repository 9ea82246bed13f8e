"""The README's first command ends in `tuner demo`: run it for real and check it shows what it promises."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import realservers
from conftest import require


def test_demo_shows_queueing_and_signals_from_a_real_vllm(tmp_path):
    require(realservers.VLLM_PYTHON, realservers.TINY_MODEL)
    proc = subprocess.run([sys.executable, "-m", "tuner.cli", "demo", "--vllm-python", str(realservers.VLLM_PYTHON.path()),
                           "--model", str(realservers.TINY_MODEL.path()), "--workdir", str(tmp_path / "demo")],
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:] + out[-3000:]
    assert "vLLM healthy after" in out and "stopped vLLM (exit 0)" in out
    # A status table after each phase; the last one has the target up. (Mid-load, a loaded CPU vLLM can
    # answer /metrics slower than the scrape timeout: such a scrape is recorded down, as it should be.)
    rows = re.findall(r"^tiny-llama\s+vllm\s+(\S+)\s+0/tiny-llama\s+\S+\s+(\d+)/(\d+)", out, re.M)
    assert len(rows) >= 3 and rows[-1][0] == "up"
    engine = json.loads(out.split("--window 1m --json\n", 1)[1].split("\n\n===", 1)[0])
    assert engine["requests_waiting_max"] >= 1  # 16 concurrent against --max-num-seqs 4
    assert engine["queue_p99"] > 0  # and the queue-time histogram says they waited
    assert engine["e2e_p99"] > 0 and engine["generation_tokens_per_s"] > 0 and engine["goodput_ratio"] is not None
    assert 'tuner_target_up{target="tiny-llama"} 1.0' in out
