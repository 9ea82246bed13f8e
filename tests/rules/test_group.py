"""eval_group, the one evaluation of a group the daemon and the scenario runner share: its rules in order, a rule
that fails left as it was, what is due to send."""

from __future__ import annotations

from datetime import timedelta

from tuner.config import Target
from tuner.rules.group import Inputs, eval_group
from tuner.rules.model import parse_rules
from tuner.signals.derive import EngineSignals, TargetSignals

RULES = parse_rules(
    """
groups:
  - name: g
    interval: 15s
    rules:
      - {alert: Waiting, signal: queue_to_max_num_seqs, op: ">", threshold: 1}
      - {alert: Hot, signal: kv_cache_usage, op: ">", threshold: 0.9}
""",
    "rules.yaml",
)
GROUP = RULES.groups[0]
CHAT = Target(name="chat", backend="vllm", url="http://127.0.0.1:1")


def _signals(kv: float, waiting: float = 12.0):
    sig = TargetSignals(
        "chat", "vllm", 300.0, 0.0, None, (EngineSignals("0", "m", 10, kv_cache_usage=kv, requests_waiting=waiting),)
    )
    return lambda name, window: sig if name == "chat" else None


def test_rules_fire_in_order_and_are_due_once_per_resend_delay():
    inputs = Inputs([CHAT], _signals(0.95), max_num_seqs=lambda t: 8.0)
    first = eval_group(GROUP, {}, 0, inputs)
    assert first.failed == {}
    assert [(e["rule"], e["to_state"]) for e in first.events] == [  # no `for`: pending and firing at once
        ("g/Waiting", "pending"),
        ("g/Waiting", "firing"),
        ("g/Hot", "pending"),
        ("g/Hot", "firing"),
    ]
    assert [(k, a.state) for k, a in first.due] == [("g/Waiting", "firing"), ("g/Hot", "firing")]
    # 15s later: still firing, sent 15s ago, resend_delay 1m: nothing due, no event
    again = eval_group(GROUP, first.state, 15_000, inputs)
    assert again.events == [] and again.due == []
    later = eval_group(GROUP, again.state, 75_000, inputs)
    assert [k for k, _ in later.due] == ["g/Waiting", "g/Hot"]


def test_a_rule_that_raises_keeps_its_alerts_and_the_others_go_on():
    """A max-num-seqs written as text is a value no rule expects: that rule fails with its key and source, its alert
    stays as it was (absent from the new state), and the KV rule resolves as usual."""
    fired = eval_group(GROUP, {}, 0, Inputs([CHAT], _signals(0.95), max_num_seqs=lambda t: 8.0))
    before = {k: dict(v) for k, v in fired.state.items()}
    broken = Inputs([CHAT], _signals(0.5), max_num_seqs=lambda t: "eight")  # type: ignore[arg-type, return-value]
    out = eval_group(GROUP, fired.state, 15_000, broken)
    assert out.failed == {
        "g/Waiting": "rule g/Waiting (rules.yaml:6) failed to evaluate: ValueError: could not "
        "convert string to float: 'eight'"
    }
    assert set(out.state) == {"g/Hot"}
    assert [a.state for a in out.state["g/Hot"].values()] == ["inactive"]
    assert [(k, a.state) for k, a in out.due] == [("g/Hot", "inactive")]  # its resolution is sent
    assert fired.state == before  # the alerts given are never modified


def test_resend_delay_and_interval_set_valid_until():
    """ValidUntil = now + 4 x max(interval, resend_delay), as Prometheus sets it."""
    out = eval_group(
        GROUP, {}, 0, Inputs([CHAT], _signals(0.95), max_num_seqs=lambda t: 8.0), resend_delay=timedelta(seconds=5)
    )
    assert {a.valid_until_ms for _, a in out.due} == {4 * 15_000}
