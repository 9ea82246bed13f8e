"""Alert rules: the rule model and files, Prometheus's state machine, export and scenarios."""

from tuner.rules.evaluate import evaluate, payload, to_send, vector
from tuner.rules.model import Rule, RuleGroup, RuleSet, load_rule_files, parse_rules

__all__ = ["Rule", "RuleGroup", "RuleSet", "load_rule_files", "parse_rules", "evaluate", "vector", "to_send", "payload"]
