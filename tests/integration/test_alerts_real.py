"""End to end: a real vLLM with a tiny KV cache under distinct prompts → tuner's alerts → a real Alertmanager → webhook."""

from __future__ import annotations

import threading
import time

import yaml
from realservers import run_load_process

from tests.conftest import require_tool
from tests.notify.conftest import Alertmanager, Webhook
from tuner.config import parse_config
from tuner.daemon import Daemon
from tuner.rules.model import default_rule_files


def _pack_with_overrides(tmp_path, target: str):
    """The default pack, evaluated every second, with per-target overrides short enough for a test."""
    doc = yaml.safe_load(open(default_rule_files()[0]))
    for g in doc["groups"]:
        g["interval"] = "1s"
        for r in g["rules"]:
            if r["alert"] == "KVCacheHigh" and r.get("backend") == "vllm":
                # KV use dips while the scheduler preempts: fire on the first observation above 0.5
                r["overrides"] = {target: {"threshold": 0.5, "for": "0s"}}
            if r["alert"] == "PreemptionsHigh":
                r["overrides"] = {target: {"threshold": 0.0, "for": "0s"}}  # any preemption in the window
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _diagnosis(store, hook, daemon) -> str:
    from tuner.signals.derive import compute_signals
    from tuner.store.alerts import history, outbox_size

    now = time.time()
    sig = [
        (e.kv_cache_usage_max, e.preemptions_per_s)
        for e in compute_signals(store.window("tiny", now - 120, now)).engines
    ]
    return (
        f"webhook got {[a['labels']['alertname'] for a in hook.alerts()]}; (kv max, preemptions/s) {sig}; "
        f"history {[(h.rule, h.to_state) for h in history(store)]}; outbox {outbox_size(store)}; "
        f"job errors {daemon.state.job_errors}"
    )


def test_kv_pressure_on_real_vllm_fires_alerts_that_reach_the_webhook(vllm_server_factory, store, tmp_path):
    binary = require_tool("prometheus-alertmanager")
    server = vllm_server_factory(flags={"kv-cache-memory-bytes": 3_000_000})
    hook = Webhook()
    am = Alertmanager(binary, tmp_path / "am", hook).start()
    try:
        rules = _pack_with_overrides(tmp_path, "tiny")
        cfg = parse_config(
            "defaults: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            f"targets:\n  - {{name: tiny, backend: vllm, url: '{server.url}'}}\n"
            f"alerting: {{rule_files: ['{rules}'], alertmanagers: ['{am.url}']}}\n"
        )
        daemon = Daemon(cfg, store)
        thread = threading.Thread(target=daemon.run_forever, kwargs={"install_signal_handlers": False}, daemon=True)
        thread.start()
        try:
            time.sleep(2)

            # ~3 MB of KV holds ~5,800 tokens; 8 running sequences of ~1,000 tokens each do not fit, so the
            # scheduler preempts, and the cache stays near full for the whole load.
            def fired(w, name):
                return any(a["labels"]["alertname"] == name for a in w.alerts("firing"))

            # KVCacheHigh reads the KV gauge, a sample: a loaded CPU vLLM answers /metrics late exactly while its
            # cache is fullest, and a CI run once stored a 0.95 peak that no evaluation saw. So the load is driven
            # again (at most 3 rounds) until both alerts fired; only the observation is retried, every assertion
            # below stays as it is.
            for _ in range(3):
                load = run_load_process(
                    server.url,
                    model=server.model_name,
                    n_requests=32,
                    concurrency=16,
                    prompt_tokens_approx=600,
                    max_tokens=380,
                    distinct_prompts=True,
                    timeout_s=300,
                )
                assert load.ok == 32, load.errors
                ok = hook.wait_for(lambda w: fired(w, "KVCacheHigh") and fired(w, "PreemptionsHigh"), 30)
                if ok:
                    break
            assert ok, _diagnosis(store, hook, daemon)
        finally:
            daemon.stop()
            thread.join(30)
        kv = next(a for a in hook.alerts("firing") if a["labels"]["alertname"] == "KVCacheHigh")
        assert kv["labels"] == {
            "alertname": "KVCacheHigh",
            "target": "tiny",
            "engine": "0",
            "model_name": server.model_name,
            "severity": "critical",
        }
        assert kv["annotations"]["summary"].startswith("KV cache ") and "full on tiny" in kv["annotations"]["summary"]
        pre = next(a for a in hook.alerts("firing") if a["labels"]["alertname"] == "PreemptionsHigh")
        assert "preemptions/s on tiny" in pre["annotations"]["summary"]
    finally:
        am.stop()
        hook.httpd.shutdown()
