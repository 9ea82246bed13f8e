"""Advise: the memory model and diagnosis -> flag recommendations with evidence, filtered for safety.

Pure functions of (signals, observed workload, current flags, model facts, GPU facts, server facts, now):
``diagnose`` proposes, ``evaluate`` filters (allow-list, server version, memory model), merges and expires.
"""

from tuner.advise.diagnose import RULES, THRESHOLDS, Candidate, Inputs, diagnose
from tuner.advise.facts import GpuFacts, ModelFacts, Observed, ServerFacts, load_model, model_from_config, observe
from tuner.advise.memory import MemoryPlan, kv_bytes_per_token, plan, weights_bytes
from tuner.advise.recommend import MemoryCheck, Outcome, Previous, Recommendation, Suppressed, evaluate, memory_check

__all__ = [
    "Inputs",
    "Candidate",
    "diagnose",
    "RULES",
    "THRESHOLDS",
    "ModelFacts",
    "GpuFacts",
    "ServerFacts",
    "Observed",
    "load_model",
    "model_from_config",
    "observe",
    "MemoryPlan",
    "plan",
    "weights_bytes",
    "kv_bytes_per_token",
    "MemoryCheck",
    "Recommendation",
    "Suppressed",
    "Previous",
    "Outcome",
    "evaluate",
    "memory_check",
]
