"""Walks without detours (issue 41, item 7): each use case reads what it needs once and hands it on as read.

Real store (SQLite in tmp_path), real recorded scrapes, real Applier; the only thing replaced is a counting wrapper
around the reader or the loader, which still does the reading.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import store_recorded_history
from tuner.advise.recommend import evaluate
from tuner.app import recommend as rec_app
from tuner.app import room
from tuner.app import tune as tune_app
from tuner.app.auto import auto_step
from tuner.app.recommend import RecommendRequest, gather_inputs
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
    cfg = parse_config(
        "gpu: {source: none}\ntargets:\n  - {name: v, backend: vllm, url: 'http://127.0.0.1:9', "
        "flags: {max_num_seqs: 8, enable_prefix_caching: true}, "
        "apply: {mode: auto, maintenance_windows: ['daily 04:00-05:00']}}\n"
    )
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
    config.write_text(
        f"store: {{url: '{store.engine.url}'}}\ngpu: {{source: none}}\n"
        "targets:\n  - {name: v, backend: vllm, url: 'http://127.0.0.1:9'}\n"
    )
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

    assert (
        main(["--config", str(config), "recommend", "v", "--window", "1h", "--flag", " max_num_seqs = 6", "--json"])
        == 0
    )
    [(_, (req, *_), _)] = gathered
    assert dict(req.flags) == {"max_num_seqs": 6} and req.in_force is None  # typed by the CLI; in force read there


def test_tune_set_up_reads_the_model_and_the_flags_once_and_seeds_from_the_advisor_with_them(
    tmp_path, store, monkeypatch
):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "hidden_size": 128, '
        '"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, '
        '"intermediate_size": 256, "vocab_size": 4096, '
        '"max_position_embeddings": 2048}'
    )
    # no max_model_len in force: the stored window's workload is limited by the model's context, which is read for
    # that, for the memory model and for the advisor: once
    cfg = parse_config(
        "gpu: {source: none}\ntargets:\n  - name: v\n    backend: vllm\n    url: http://127.0.0.1:9\n"
        "    slo: {e2e_p99: 4s}\n"
        f"    managed: {{model: {model}, flags: {{max_num_seqs: 2}}, "
        "env: {VLLM_CPU_KVCACHE_SPACE: '1'}, executable: /nonexistent/python}\n"
    )
    end = store_recorded_history(store, T0)
    loads: list[Any] = []
    for module in (tune_app, rec_app, room):
        _counting(monkeypatch, module, "load_model", loads)
    reads: list[Any] = []
    for module in (tune_app, rec_app):
        _counting(monkeypatch, module, "flags_in_force", reads)
    gathered: list[Any] = []
    _counting(monkeypatch, rec_app, "gather_inputs", gathered)
    advised: list[Any] = []
    _counting(monkeypatch, tune_app, "evaluate", advised)

    said: list[str] = []
    with pytest.raises(Exception):  # noqa: B017 - the first trial's server cannot start (no such executable)
        tune_app.tune(
            cfg,
            store,
            tune_app.TuneRequest("v", window_s=3600, budget=1),
            config_dir=tmp_path,
            say=said.append,
            clock=lambda: end,
        )
    assert any(line.startswith("trial 1/1 (baseline)") for line in said), said  # set-up done, the search began

    assert len(loads) == 1, loads  # not again for the workload's limit, nor by recommend's gathering
    assert len(reads) == 1, reads
    assert gathered == []  # the advisor's seeds come from its core, not from the whole recommend use case
    assert advised and all(
        inp.model is not None and inp.model.max_position_embeddings == 2048 and inp.flags["max_num_seqs"] == 2
        for (_, (inp, *_), _) in advised
    )

    # the same seeds as the whole gathering gives (what set-up called before)
    monkeypatch.undo()
    whole = [evaluate(inp).emitted for inp in gather_inputs(RecommendRequest("v", 3600), cfg, store, end)]
    seeded = [evaluate(inp).emitted for (_, (inp, *_), _) in advised]
    assert [[(dict(r.diff), r.rules) for r in e] for e in seeded] == [
        [(dict(r.diff), r.rules) for r in e] for e in whole
    ]
    assert any(whole), "the recorded window makes the advisor propose something"


@pytest.mark.parametrize("recorded", [False, True])
def test_a_model_tune_cannot_read_is_read_once_and_refused_where_it_was(tmp_path, store, monkeypatch, recorded):
    """A config.json that is not JSON: without stored traffic the missing workload is named first (as before the
    model was read once); with it, the model's error stops set-up. Either way the file is read once."""
    from tuner.errors import ConfigError, ModelFactsError

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{not json")
    cfg = parse_config(
        "gpu: {source: none}\ntargets:\n  - name: v\n    backend: vllm\n    url: http://127.0.0.1:9\n"
        f"    slo: {{e2e_p99: 4s}}\n    managed: {{model: {model}, flags: {{max_num_seqs: 2}}}}\n"
    )
    end = store_recorded_history(store, T0) if recorded else T0
    loads: list[Any] = []
    _counting(monkeypatch, tune_app, "load_model", loads)
    with pytest.raises(ModelFactsError if recorded else ConfigError) as err:
        tune_app.tune(
            cfg,
            store,
            tune_app.TuneRequest("v", window_s=3600),
            config_dir=tmp_path,
            say=lambda m: None,
            clock=lambda: end,
        )
    assert recorded or err.value.key == "--workload"
    assert len(loads) == 1, loads
