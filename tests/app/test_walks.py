"""Walks without detours (issue 41, item 7): each use case reads what it needs once and hands it on as read.

Real store (SQLite in tmp_path), real recorded scrapes, real Applier; the only thing replaced is a counting wrapper
around the reader or the loader, which still does the reading.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import store_recorded_history
from tuner.app import recommend as rec_app
from tuner.app.auto import auto_step
from tuner.apply import flow
from tuner.apply.flow import Applier
from tuner.cli import main
from tuner.config import parse_config
from tuner.store import recommendations as recs

T0 = 1_700_000_000.0


def _counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, calls: list[Any]) -> None:
    """Wrap ``module.name`` so each call is recorded (its first positional arguments and keywords), then done."""
    real = getattr(module, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append((name, args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)


def test_the_auto_step_reads_the_flags_in_force_once_and_hands_the_advisor_the_dict(tmp_path, store, monkeypatch):
    # outside its maintenance window: the step evaluates and decides, and applies nothing (the apply is not this walk)
    cfg = parse_config("gpu: {source: none}\ntargets:\n  - {name: v, backend: vllm, url: 'http://127.0.0.1:9', "
                       "flags: {max_num_seqs: 8, enable_prefix_caching: true}, "
                       "apply: {mode: auto, maintenance_windows: ['daily 04:00-05:00']}}\n")
    end = store_recorded_history(store, T0)  # 2023-11-14 22:13 UTC
    reads: list[Any] = []
    _counting(monkeypatch, flow, "flags_in_force", reads)  # the applier's reader
    _counting(monkeypatch, rec_app, "flags_in_force", reads)  # recommend's own, used when no caller read them
    gathered: list[Any] = []
    _counting(monkeypatch, rec_app, "gather_inputs", gathered)
    seen: list[Any] = []
    _counting(monkeypatch, rec_app, "engine_inputs", seen)

    step = auto_step(cfg, store, Applier(cfg, store, tmp_path, say=lambda m: None), cfg.targets[0], now=end)
    assert step.decision.reason == "outside the maintenance windows" and step.applied is None

    assert len(reads) == 1, reads  # not once by auto mode and again by recommend
    [(_, (req, *_), _)] = gathered
    assert req.in_force == {"max_num_seqs": 8, "enable_prefix_caching": True}  # the dict as read: no NAME=VALUE
    assert dict(req.flags) == {}
    [(_, _, kw)] = seen
    assert kw["given"] == {"max_num_seqs": 8, "enable_prefix_caching": True}
    # what the advisor saw as current is what is in force: the stored proposals say so
    proposed = recs.proposed_for(store.engine, "v")
    assert proposed and all(r.current.get("max_num_seqs", 8) == 8 for r in proposed)


def test_the_cli_parses_flag_name_value_at_its_edge_with_its_errors(tmp_path, store, capsys, monkeypatch):
    config = tmp_path / "tuner.yaml"
    config.write_text(f"store: {{url: '{store.engine.url}'}}\ngpu: {{source: none}}\n"
                      "targets:\n  - {name: v, backend: vllm, url: 'http://127.0.0.1:9'}\n")
    store_recorded_history(store, T0)
    gathered: list[Any] = []
    _counting(monkeypatch, rec_app, "gather_inputs", gathered)

    assert main(["--config", str(config), "recommend", "v", "--window", "1h", "--flag", "max_num_seqs"]) == 2
    assert "--flag: expected NAME=VALUE (e.g. max_num_seqs=8), got 'max_num_seqs'" in capsys.readouterr().err
    assert main(["--config", str(config), "recommend", "v", "--window", "1h", "--flag", "ctx_size=4096"]) == 2
    assert "not on tuner's allow-list for vllm" in capsys.readouterr().err
    assert main(["--config", str(config), "recommend", "nope", "--flag", "ctx_size=4096"]) == 2
    assert "nope" in capsys.readouterr().err  # the unknown target is named first, as before
    assert gathered == []  # refused at the edge: the use case never ran

    assert main(["--config", str(config), "recommend", "v", "--window", "1h", "--flag", " max_num_seqs = 6",
                 "--json"]) == 0
    [(_, (req, *_), _)] = gathered
    assert dict(req.flags) == {"max_num_seqs": 6} and req.in_force is None  # typed by the CLI; in force read there
