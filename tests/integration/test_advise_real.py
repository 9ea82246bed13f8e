"""The advisor against real servers: real load makes the real symptom, `tuner recommend` must name the fix.

Also calibrates the memory model against vLLM's own KV sizing (vllm:cache_config_info) on the tiny model:
2 layers x 2 KV heads x head_dim 32, served in bfloat16 on CPU (float32 checkpoint), CPU block size 128.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import realservers
from realservers import run_load_process, running

from tests.helpers import value_of
from tuner.advise.facts import load_model
from tuner.advise.memory import plan
from tuner.apply import managed as mg
from tuner.apply.launch import free_port
from tuner.cli import main
from tuner.collect.http import get
from tuner.config import parse_config
from tuner.daemon import Daemon
from tuner.errors import ScrapeError
from tuner.lab.proc import wait_for


def _config(tmp_path: Path, store_url: str, name: str, backend: str, url: str, interval: str) -> str:
    path = tmp_path / "tuner.yaml"
    path.write_text(
        f"store: {{url: '{store_url}'}}\ngpu: {{source: none}}\n"
        f"defaults: {{scrape_interval: {interval}, scrape_timeout: {interval}}}\n"
        f"targets:\n  - {{name: {name}, backend: {backend}, url: '{url}'}}\n"
    )
    return str(path)


def _metrics(url: str) -> str:
    return get(f"{url}/metrics", timeout_s=5, max_bytes=10 * 2**20).body.decode()


def _recommend(capsys, config: str, *args: str) -> dict:
    capsys.readouterr()
    assert main(["--config", config, "recommend", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _cache_config(url: str) -> dict[str, str]:
    from tests.helpers import series_values

    [(labels, _)] = series_values(_metrics(url), "vllm:cache_config_info")
    return labels


def test_vllm_kv_saturation_recommends_fewer_seqs_and_memory_model_matches(
    vllm_server_factory, store, tmp_path, capsys
):
    server = vllm_server_factory(flags={"kv-cache-memory-bytes": 3_000_000})
    live = _cache_config(server.url)
    # Calibration: 3,000,000 / (128 tokens x 512 bytes) = 45.8 -> 45 blocks = 5760 tokens (recorded: 45, 5760).
    p = plan(
        load_model(realservers.TINY_MODEL.path()),
        gpu_memory_bytes=2**34,
        max_model_len=1024,
        block_size=int(live["block_size"]),
        kv_cache_memory_bytes=3_000_000,
    )
    assert p.kv_bytes_per_token == 512
    assert abs(p.kv_blocks - int(live["num_gpu_blocks"])) <= 0.05 * int(live["num_gpu_blocks"])
    assert abs(p.kv_capacity_tokens - int(live["kv_cache_size_tokens"])) <= 0.05 * int(live["kv_cache_size_tokens"])
    print(
        f"calibration 3MB bf16: model {p.kv_capacity_tokens} tokens / {p.kv_blocks} blocks, vLLM "
        f"{live['kv_cache_size_tokens']} / {live['num_gpu_blocks']}"
    )

    # 1 s scrapes: KV use swings while the scheduler preempts, and the rule needs a sample of its peak.
    config = _config(tmp_path, str(store.engine.url), "vllm", "vllm", server.url, "1s")
    before = value_of(_metrics(server.url), "vllm:num_preemptions_total")
    with running(Daemon(parse_config(Path(config).read_text()), store)):
        time.sleep(2)
        # 8 distinct ~300-token prompts x 600 generated tokens = ~8 blocks each; 64 blocks wanted, 45 exist.
        # The rule's proof is the preemption counter, which no scrape misses; the KV-use gauge is sampled and a
        # busy CPU vLLM answers /metrics late exactly while it preempts, so its peak is asserted only as far as
        # a stored scrape caught it.
        load = run_load_process(
            server.url,
            model=server.model_name,
            n_requests=32,
            concurrency=8,
            prompt_tokens_approx=300,
            max_tokens=600,
            timeout_s=300,
        )
        assert load.ok == 32, load.errors
        time.sleep(2)  # a scrape after the load stores the final preemption count
        peak = max(
            v
            for (name, _), pts in store.window("vllm", time.time() - 600, time.time()).engines[0].series.items()
            if name == "vllm:kv_cache_usage_perc"
            for _, v in pts
        )
    after = value_of(_metrics(server.url), "vllm:num_preemptions_total")
    assert after - before >= 1, "the workload did not preempt: the test needs a smaller KV space"

    out = _recommend(capsys, config, "vllm", "--window", "10m", "--flag", "max_num_seqs=8")
    found = [r for r in out["recommendations"] if "vllm.kv_saturated" in r["rules"] and "max_num_seqs" in r["diff"]]
    assert len(found) == 1, {
        "recommendations": [(r["rules"], r["diff"]) for r in out["recommendations"]],
        "suppressed": out["suppressed"],
    }
    [rec] = found
    assert 1 <= rec["diff"]["max_num_seqs"] < 8
    ev = next(e for e in rec["evidence"] if e["rule"] == "vllm.kv_saturated")
    assert ev["signals"]["preemptions"] == after - before  # the exact count the server reported
    assert ev["signals"]["kv_cache_usage_max"] == peak  # the highest KV use a stored scrape caught
    assert ev["signals"]["kv_capacity_tokens"] == int(live["kv_cache_size_tokens"])
    # the peak is named as a crossed threshold exactly when a scrape caught it at 0.9 or more
    assert {t["signal"] for t in ev["thresholds"]} == {"preemptions"} | (
        {"kv_cache_usage_max"} if peak >= 0.9 else set()
    )
    assert rec["memory_check"]["ok"] is True and rec["status"] == "proposed"
    # Nothing unsafe slips out: no GPU here, so raising memory use is refused, never emitted.
    assert all("gpu_memory_utilization" not in r["diff"] for r in out["recommendations"])

    # Evaluated again: the same proposal is renewed, not duplicated.
    again = _recommend(capsys, config, "vllm", "--window", "10m", "--flag", "max_num_seqs=8")
    same = [r for r in again["recommendations"] if r["diff"] == rec["diff"]]
    assert [r["id"] for r in same] == [rec["id"]]
    capsys.readouterr()
    assert main(["--config", config, "recommendations", "show", str(rec["id"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["diff"] == rec["diff"]


def test_vllm_queue_with_kv_room_recommends_more_seqs(vllm_server_factory, store, tmp_path, capsys):
    # The model's own KV dtype (bf16): vLLM 0.32's CPU build refuses an fp8 KV cache on a CPU without AVX-512/AMX,
    # which these machines lack (the engine core dies at start).
    server = vllm_server_factory(flags={"max-num-seqs": 2, "kv-cache-memory-bytes": 50_000_000})
    live = _cache_config(server.url)
    # Calibration, bf16 KV: 512 bytes/token; 50,000,000 / (128 x 512) = 762.9 -> 762 blocks = 97,536 tokens.
    p = plan(
        load_model(realservers.TINY_MODEL.path()),
        gpu_memory_bytes=2**34,
        max_model_len=1024,
        kv_cache_dtype="auto",
        block_size=int(live["block_size"]),
        kv_cache_memory_bytes=50_000_000,
    )
    assert abs(p.kv_capacity_tokens - int(live["kv_cache_size_tokens"])) <= 0.05 * int(live["kv_cache_size_tokens"])
    print(f"calibration 50MB bf16: model {p.kv_capacity_tokens} tokens, vLLM {live['kv_cache_size_tokens']}")

    # 2 s scrapes: a loaded CPU vLLM can take over 1 s to answer /metrics on a busy machine.
    config = _config(tmp_path, str(store.engine.url), "vllm", "vllm", server.url, "2s")
    with running(Daemon(parse_config(Path(config).read_text()), store)):
        time.sleep(3)
        load = run_load_process(
            server.url,
            model=server.model_name,
            n_requests=32,
            concurrency=8,
            prompt_tokens_approx=100,
            max_tokens=300,
            timeout_s=300,
        )
        time.sleep(2)
    assert load.ok == 32, load.errors
    out = _recommend(capsys, config, "vllm", "--window", "10m", "--flag", "max_num_seqs=2")
    [rec] = [r for r in out["recommendations"] if "vllm.queue_with_kv_room" in r["rules"]]
    ev = rec["evidence"][0]
    # running, waiting and KV use are sampled gauges, and a loaded CPU vLLM answers /metrics late exactly while its
    # queue is longest: in one CI run no scrape of the loaded server was stored at all. So each is asserted only as
    # far as a scrape caught it; the queue itself is certain from the queue-time histogram.
    n_running = ev["signals"].get("requests_running_max") or 0
    waiting = ev["signals"].get("requests_waiting_max") or 0
    assert n_running <= 2  # never above max-num-seqs
    if waiting >= 1:  # a scrape caught the queue (8 clients, 2 running: at most 6 wait): raised by the queue
        assert n_running == 2 and waiting <= 6 and rec["diff"] == {"max_num_seqs": min(4, 2 + int(waiting))}
    else:  # no scrape caught it: the queue-time histogram did, and the limit is known, so it is doubled
        assert ev["signals"]["queue_p99"] >= 0.25 and rec["diff"] == {"max_num_seqs": 4}
    assert (ev["signals"].get("kv_cache_usage_max") or 0) < 0.8
    assert rec["memory_check"]["ok"] is True
    assert not [r for r in out["recommendations"] if "vllm.kv_saturated" in r["rules"]]


def test_llama_server_deferred_recommends_parallel_keeping_slot_context(llama_server, store, tmp_path, capsys):
    config = _config(tmp_path, str(store.engine.url), "llama", "llamacpp", llama_server.url, "200ms")
    with running(Daemon(parse_config(Path(config).read_text()), store)):
        time.sleep(1)
        # 8 at a time against --parallel 2: six wait (deferred) while two decode long answers.
        # 48 requests keep the slots saturated across many 200 ms scrapes (the tiny GGUF is fast).
        load = run_load_process(
            llama_server.url,
            model=None,
            n_requests=48,
            concurrency=8,
            prompt_tokens_approx=100,
            max_tokens=380,
            timeout_s=300,
        )
        time.sleep(1)
    assert load.ok == 48, load.errors
    longest = value_of(_metrics(llama_server.url), "llamacpp:n_tokens_max")
    out = _recommend(capsys, config, "llama", "--window", "10m")
    [rec] = [r for r in out["recommendations"] if "llamacpp.deferred" in r["rules"]]
    new_parallel = rec["diff"]["parallel"]
    # The config gives no flags: /props says 2 slots of 512 tokens, which is -c 1024 with a buffer per slot but
    # could be -c 512 on one shared buffer, so the proposal sets -c itself (tuner/advise/facts.py)
    ctx = rec["diff"]["ctx_size"]
    assert 2 < new_parallel <= 4  # at most double
    assert ctx // new_parallel >= longest, "each slot must still hold the longest request seen"
    assert rec["current"] == {"parallel": 2}
    ev = rec["evidence"][0]
    assert ev["signals"]["requests_deferred_max"] >= 1 and ev["signals"]["slots_busy_max"] == 2
    assert ev["signals"]["longest_request_tokens"] == longest
    assert rec["memory_check"]["ok"] is True


def test_managed_llama_server_on_its_unified_kv_buffer_gets_a_buffer_per_slot(store, tmp_path, capsys):
    """A managed llama-server started without --parallel: its own log says 4 slots on one unified KV buffer. Four
    clients keep every slot busy; `tuner recommend` proposes the same 4 slots as an explicit --parallel at the same
    -c, and a server started with the argv tuner builds for the proposal runs them on a buffer each (its log).
    Which of the two serves more is measured in bench/llama_kv_unified.py (fresh servers in turns), not here."""
    url = f"http://127.0.0.1:{free_port()}"
    config = tmp_path / "tuner.yaml"
    config.write_text(
        f"store: {{url: '{store.engine.url}'}}\ngpu: {{source: none}}\n"
        "defaults: {scrape_interval: 200ms, scrape_timeout: 200ms}\n"
        f"targets:\n  - name: llama\n    backend: llamacpp\n    url: '{url}'\n"
        f"    managed:\n      model: {realservers.TINY_GGUF.path()}\n"
        f"      executable: {realservers.LLAMA_SERVER.path()}\n"
        f"      flags: {{ctx_size: 4096}}\n      extra_args: {{'-t': 1}}\n      log_dir: {tmp_path / 'logs'}\n"
    )
    cfg = parse_config(config.read_text())
    target = cfg.target("llama")
    log = mg.log_path(target, tmp_path)
    try:
        _unified_then_per_slot(cfg, target, store, url, log, tmp_path, capsys, config)
    finally:  # the daemon leaves a managed server running when it stops (a restarted daemon adopts it)
        pid = mg.find_by_argv(mg.build_argv(target, {"ctx_size": 4096}))
        if pid is not None:
            os.killpg(pid, signal.SIGKILL)


def _up(url: str) -> bool:
    try:
        return get(f"{url}/health", timeout_s=2, max_bytes=4096).status == 200
    except ScrapeError:
        return False


def _unified_then_per_slot(cfg, target, store, url, log, tmp_path, capsys, config) -> None:  # type: ignore[no-untyped-def]
    with running(Daemon(cfg, store)):
        wait_for(lambda: _up(url), 120, "the managed server up")
        load = run_load_process(
            url, model=None, n_requests=32, concurrency=4, prompt_tokens_approx=100, max_tokens=300, timeout_s=300
        )
        seen = store.scrapes("llama")
        wait_for(lambda: store.scrapes("llama") >= seen + 2, 30, "two scrapes after the load")
        longest = value_of(_metrics(url), "llamacpp:n_tokens_max")
    assert load.ok == 32, load.errors
    started = log.read_text(errors="replace")
    assert "n_slots = 4" in started and "kv_unified = 'true'" in started, "the premise: 4 slots on one buffer"
    out = _recommend(capsys, str(config), "llama", "--window", "10m")
    [rec] = [r for r in out["recommendations"] if "llamacpp.kv_unified" in r["rules"]]
    assert rec["diff"] == {"parallel": 4} and rec["current"] == {"parallel": None, "ctx_size": 4096}
    ev = rec["evidence"][0]
    assert ev["signals"]["slots_busy_max"] == 4 and ev["signals"]["slots_total"] == 4
    assert ev["signals"]["longest_request_tokens"] == longest and 4096 // 4 >= longest, "a slot's share holds it"
    assert rec["memory_check"]["ok"] is True
    assert not [r for r in out["recommendations"] if "llamacpp.deferred" in r["rules"]]

    # The candidate is what it says: the same 4 slots, each on its own buffer.
    shadow = target.model_copy(update={"url": f"http://127.0.0.1:{free_port()}"})
    after = tmp_path / "after.log"
    server = mg.start_server(mg.build_argv(shadow, {"ctx_size": 4096, **rec["diff"]}), mg.server_env(shadow), after)
    try:
        mg.wait_healthy(server, shadow.url, 120)
        text = after.read_text(errors="replace")
        assert "n_slots = 4" in text and "kv_unified = 'false'" in text, text[-2000:]
    finally:
        mg.stop_server(server, grace_s=5)
