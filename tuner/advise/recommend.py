"""From candidates to recommendations: safety filter, duplicate merge, expiry on recovery. Pure.

The safety filter guarantees that an emitted recommendation
  * changes only flags on the allow-list (tuner/flags.py), each value of its type and inside its bounds;
  * changes only flags the running server supports (its --help when known, else its version);
  * passes the memory model: the plan after the change fits, holds at least one max-model-len sequence and
    the KV tokens the change needs. A change that needs more memory and cannot be checked (no model or GPU
    facts) is not emitted; a change that only lowers memory use passes without them.
Candidates with the same target and diff merge into one recommendation that lists every rule's evidence.
A proposed recommendation whose diff no rule proposes any more, evaluated on a window with data, expires.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tuner.advise.diagnose import Candidate, Inputs, diagnose
from tuner.advise.memory import GIB, kv_bytes_per_token, plan
from tuner.backends import kv_block_size
from tuner.errors import FlagError
from tuner.flags import supported, validate

__all__ = ["MemoryCheck", "Recommendation", "Suppressed", "Previous", "Outcome", "memory_check", "evaluate", "diff_key"]

# Changes that can only lower memory use (flag, direction): "down" means a smaller value, "on" a True.
_LOWERS = {
    ("max_num_seqs", "down"),
    ("max_model_len", "down"),
    ("max_num_batched_tokens", "down"),
    ("kv_cache_dtype", "fp8"),
    ("quantization", "fp8"),
    ("tensor_parallel_size", "up"),
    ("enable_prefix_caching", "on"),
    ("enable_chunked_prefill", "on"),
    # llama-server's KV cache is -c cells however many slots share it, one buffer or one each (llamacpp.kv_unified
    # sets the slot count it runs already, as an explicit --parallel)
    ("parallel", "up"),
    ("parallel", "down"),
    ("parallel", "same"),
    ("ctx_size", "down"),
    ("n_gpu_layers", "down"),
    ("ubatch_size", "down"),
    ("batch_size", "down"),
}


@dataclass(frozen=True)
class MemoryCheck:
    ok: bool
    reason: str
    before: Mapping[str, Any]
    after: Mapping[str, Any]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Recommendation:
    """One emitted recommendation: safe, merged, ready to store."""

    target: str
    key: str  # the diff as canonical JSON: what duplicates share
    rules: tuple[str, ...]
    diff: Mapping[str, Any]
    current: Mapping[str, Any]
    evidence: tuple[Mapping[str, Any], ...]  # one per merged rule
    expected_effect: str
    risk: str
    confidence: float
    rank: int
    memory: MemoryCheck
    support: Mapping[str, str]  # flag -> why the server takes it


@dataclass(frozen=True)
class Suppressed:
    """A candidate the safety filter refused, and why (shown, never stored as a recommendation)."""

    rule: str
    diff: Mapping[str, Any]
    reason: str


@dataclass(frozen=True)
class Previous:
    """A stored recommendation still proposed for this target."""

    id: int
    key: str


@dataclass(frozen=True)
class Outcome:
    emitted: tuple[Recommendation, ...]
    suppressed: tuple[Suppressed, ...]
    refreshed: Mapping[str, int]  # key -> id of the stored proposal that the emitted one renews
    expired: tuple[int, ...]  # ids of stored proposals whose symptom is gone


def diff_key(diff: Mapping[str, Any]) -> str:
    return json.dumps(dict(diff), sort_keys=True, separators=(",", ":"))


def _direction(name: str, old: Any, new: Any) -> str:
    if isinstance(new, bool):
        return "on" if new else "off"
    if isinstance(new, str):
        return new
    if old is None:
        return "unknown"
    return "down" if new < old else "up" if new > old else "same"


def memory_check(inp: Inputs, cand: Candidate) -> MemoryCheck:
    """Whether the memory model accepts ``cand``; see the module docstring for what it guarantees."""
    if inp.backend == "vllm":
        return _check_vllm(inp, cand)
    return _check_llama(inp, cand)


def _vllm_args(flags: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "gpu_memory_utilization": float(flags.get("gpu_memory_utilization") or 0.9),
        "max_model_len": flags.get("max_model_len"),
        "kv_cache_dtype": flags.get("kv_cache_dtype") or "auto",
        "tensor_parallel_size": int(flags.get("tensor_parallel_size") or 1),
        "quantization": flags.get("quantization"),
        "max_num_batched_tokens": flags.get("max_num_batched_tokens"),
    }


def _check_vllm(inp: Inputs, cand: Candidate) -> MemoryCheck:
    if "backend" in cand.diff:
        return MemoryCheck(True, "a backend change is planned anew on the other server", {}, {})
    after_flags = {**inp.flags, **cand.diff}
    live = inp.kv_capacity_tokens
    m, g = inp.model, inp.gpu
    if m is not None and g.memory_total_bytes:
        block = kv_block_size(inp.live) or 16  # vLLM's GPU default where the server does not say
        try:
            before = plan(m, gpu_memory_bytes=g.memory_total_bytes, block_size=block, **_vllm_args(inp.flags))
            after = plan(m, gpu_memory_bytes=g.memory_total_bytes, block_size=block, **_vllm_args(after_flags))
        except ValueError as exc:
            return MemoryCheck(False, f"memory model cannot plan it: {exc}", {}, {})
        b, a = _brief(before), _brief(after)
        if not after.fits:
            return MemoryCheck(False, f"does not fit: {after.reason}", b, a)
        capacity = after.kv_capacity_tokens
        if live and before.kv_capacity_tokens:  # scale the live figure by the model's ratio
            capacity = int(live * after.kv_capacity_tokens / before.kv_capacity_tokens)
            a["kv_capacity_tokens_live_scaled"] = capacity
        if cand.kv_tokens_needed and capacity < cand.kv_tokens_needed:
            return MemoryCheck(
                False, f"KV cache would hold {capacity} tokens, the change needs {cand.kv_tokens_needed}", b, a
            )
        return MemoryCheck(True, after.reason, b, a)
    # No model/GPU facts: only what the live KV figure or the direction of the change proves.
    before_j = {"kv_capacity_tokens": live} if live else {}
    for name, new in cand.diff.items():
        if (name, _direction(name, inp.flags.get(name), new)) in _LOWERS:
            continue
        if name == "max_num_seqs" and live and cand.kv_tokens_needed is not None:
            if cand.kv_tokens_needed > live:
                return MemoryCheck(
                    False,
                    f"the server's KV cache holds {live} tokens, {new} sequences of the mean "
                    f"observed length need {cand.kv_tokens_needed}",
                    before_j,
                    before_j,
                )
            continue
        if name == "max_model_len" and live and new <= live:
            continue
        return MemoryCheck(
            False,
            f"{name} {inp.flags.get(name)} -> {new} may need more memory and tuner has no "
            "model/GPU facts to check it (pass --model and run with GPU telemetry)",
            before_j,
            {},
        )
    why = (
        "the change only lowers memory use"
        if not cand.kv_tokens_needed
        else (f"the server's KV cache holds {live} tokens, the change needs {cand.kv_tokens_needed}")
    )
    return MemoryCheck(True, why, before_j, before_j)


def _brief(p: Any) -> dict[str, Any]:
    return {
        "weights_bytes": p.weights_bytes,
        "kv_bytes_per_token": p.kv_bytes_per_token,
        "kv_capacity_tokens": p.kv_capacity_tokens,
        "max_concurrency": round(p.max_concurrency, 3),
        "kv_budget_bytes": p.kv_budget_bytes,
        "fits": p.fits,
    }


def _check_llama(inp: Inputs, cand: Candidate) -> MemoryCheck:
    if "backend" in cand.diff:
        m, g = inp.model, inp.gpu
        if cand.diff["backend"] == "vllm" and m is not None and g.memory_total_bytes:
            p = plan(m, gpu_memory_bytes=g.memory_total_bytes, max_model_len=inp.flags.get("ctx_size"))
            return MemoryCheck(p.fits, f"on vLLM: {p.reason}", {}, _brief(p))
        if cand.diff["backend"] == "vllm":
            return MemoryCheck(False, "moving to vLLM needs model and GPU facts to plan", {}, {})
        return MemoryCheck(True, "a backend change is planned anew on the other server", {}, {})
    m = inp.model
    extra = 0
    notes = []
    for name, new in cand.diff.items():
        old = inp.flags.get(name) or cand.current.get(name)
        if (name, _direction(name, old, new)) in _LOWERS:
            continue
        if m is None:
            return MemoryCheck(False, f"raising {name} needs model facts (pass --model with the GGUF)", {}, {})
        if name == "ctx_size":
            per_tok = kv_bytes_per_token(m, "float16")  # llama-server's default KV type is f16
            grow = (int(new) - int(old or 0)) * per_tok
            extra += grow
            notes.append(f"-c {old}->{new}: +{grow / 2**20:.1f} MiB KV ({per_tok} bytes/token)")
        elif name in ("ubatch_size", "batch_size"):
            grow = (int(new) - int(old or 0)) * (m.vocab_size + 4 * m.hidden_size) * 4  # logits + activations, f32
            extra += max(0, grow)
            notes.append(f"{name} {old}->{new}: +{grow / 2**20:.1f} MiB compute buffer")
        elif name == "n_gpu_layers":
            layers = min(int(new), m.num_layers + 1) - min(int(old or 0), m.num_layers + 1)
            per_layer = (m.checkpoint_bytes or m.params * 2) / (m.num_layers + 1)
            # -c as configured; else the most the server's slots say they hold (slots x one slot's n_ctx: /props
            # cannot give -c itself, tuner/advise/facts.py flags_from_live_config), so the KV is not undercounted
            o = inp.observed
            seen = int(o.slots_total * o.slot_context_tokens) if o.slots_total and o.slot_context_tokens else None
            ctx = int(inp.flags.get("ctx_size") or seen or 4096)
            grow = int(layers * per_layer + layers * ctx * kv_bytes_per_token(m, "float16") / m.num_layers)
            extra += grow
            notes.append(f"-ngl {old}->{new}: +{grow / GIB:.2f} GiB on the GPU")
        else:
            return MemoryCheck(False, f"no memory model for raising {name}", {}, {})
    if not extra:
        return MemoryCheck(True, "the change does not add memory", {}, {})
    on_gpu = inp.gpu.vendor != "none" and (inp.flags.get("n_gpu_layers") or 0) > 0 or "n_gpu_layers" in cand.diff
    free = inp.gpu.memory_free_bytes if on_gpu else inp.host_memory_available_bytes
    where = "GPU" if on_gpu else "host"
    if free is None:
        return MemoryCheck(
            False,
            f"needs {extra / 2**20:.1f} MiB more {where} memory and free memory is unknown",
            {},
            {"extra_bytes": extra},
        )
    ok = extra <= 0.9 * free  # keep a tenth free for everything else
    return MemoryCheck(
        ok,
        ("fits: " if ok else "does not fit: ") + "; ".join(notes) + f"; {where} memory free {free / GIB:.2f} GiB",
        {f"{where}_free_bytes": free},
        {"extra_bytes": extra},
    )


def _safety(inp: Inputs, cand: Candidate) -> tuple[str | None, dict[str, str], MemoryCheck | None]:
    """(reason it is refused or None, support notes, memory check)."""
    notes: dict[str, str] = {}
    for name, value in cand.diff.items():
        try:
            if validate(inp.backend, name, value) != value and not isinstance(value, bool):
                return f"{name}={value!r} is not in its declared form", notes, None
        except FlagError as exc:
            return str(exc), notes, None
        ok, why = supported(inp.backend, name, inp.server.version, inp.server.help_options)
        if not ok:
            return why, notes, None
        notes[name] = why
    check = memory_check(inp, cand)
    if not check.ok:
        return f"memory model rejects it: {check.reason}", notes, check
    return None, notes, check


def evaluate(inp: Inputs, previous: Sequence[Previous] = ()) -> Outcome:
    """Diagnose, filter, merge, and decide which stored proposals are renewed or expired."""
    merged: dict[str, Recommendation] = {}
    suppressed: list[Suppressed] = []
    for cand in diagnose(inp):
        reason, support, check = _safety(inp, cand)
        if reason is not None or check is None:
            suppressed.append(Suppressed(cand.rule, dict(cand.diff), reason or "no memory check"))
            continue
        key = diff_key(cand.diff)
        have = merged.get(key)
        if have is None:
            merged[key] = Recommendation(
                target=inp.target,
                key=key,
                rules=(cand.rule,),
                diff=dict(cand.diff),
                current=dict(cand.current),
                evidence=({"rule": cand.rule, **cand.evidence},),
                expected_effect=cand.expected_effect,
                risk=cand.risk,
                confidence=cand.confidence,
                rank=cand.rank,
                memory=check,
                support=support,
            )
        else:
            merged[key] = Recommendation(
                target=have.target,
                key=key,
                rules=tuple(dict.fromkeys(have.rules + (cand.rule,))),
                diff=have.diff,
                current=have.current,
                evidence=have.evidence + ({"rule": cand.rule, **cand.evidence},),
                expected_effect=have.expected_effect,
                risk=have.risk,
                confidence=max(have.confidence, cand.confidence),
                rank=min(have.rank, cand.rank),
                memory=have.memory,
                support=have.support,
            )
    refreshed = {p.key: p.id for p in previous if p.key in merged}
    has_data = inp.signals.samples > 0
    expired = tuple(p.id for p in previous if p.key not in merged and has_data)
    return Outcome(emitted=tuple(merged.values()), suppressed=tuple(suppressed), refreshed=refreshed, expired=expired)
