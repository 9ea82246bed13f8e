"""What `tuner tune` may try: the allow-listed flags as ordered axes, and which points can start at all. Pure.

Every candidate passes ``feasible`` before any server starts with it:
  * each value is valid for its flag (tuner/flags.py: type and bounds);
  * vLLM's own start-up checks: max-num-batched-tokens >= max-num-seqs, and >= max-model-len when chunked prefill
    is off (vLLM refuses both at start), either flag left out read as the number vLLM takes for it
    (tuner/advise/memory.py ``vllm_batch_defaults``);
  * max-model-len holds the longest request of the workload (else the replay's requests are refused);
  * the memory model (tuner/advise/memory.py) says the KV cache holds one max-model-len sequence: on a GPU from
    its memory and --gpu-memory-utilization, on a CPU host from the KV space vLLM is given
    (VLLM_CPU_KVCACHE_SPACE).
llama-server: each slot's context (-c / --parallel) holds the workload's longest request (else the server
refuses it), -ub <= -b, and weights + the f16 KV cache of -c tokens + 0.5 GiB of buffers fit the memory a trial
server may take.
A point that fails is never started; it is recorded as pruned, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from tuner.advise.facts import ModelFacts
from tuner.advise.memory import MemoryPlan, kv_bytes_per_token, plan, vllm_batch_defaults, weights_bytes
from tuner.errors import FlagError
from tuner.flags import FlagValue, cli_name, validate
from tuner.signals.workload import Workload

__all__ = [
    "Axis",
    "Hardware",
    "Verdict",
    "PRUNE_KINDS",
    "axes_for",
    "workload_flags",
    "step_budget",
    "vllm_axes",
    "llama_axes",
    "feasible",
    "canonical",
    "SEARCHABLE_VLLM",
    "SEARCHABLE_LLAMA",
    "not_applied",
    "missing_from_argv",
]

SEARCHABLE_VLLM = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "gpu_memory_utilization",
    "kv_cache_dtype",
    "max_model_len",
)
_GPU_ONLY = ("gpu_memory_utilization", "kv_cache_dtype")
SEARCHABLE_LLAMA = ("parallel", "ctx_size", "batch_size", "ubatch_size", "flash_attn")
_LLAMA_RUNTIME_BYTES = 512 * 2**20  # llama-server's own buffers beyond weights and KV (compute graph, slots)


@dataclass(frozen=True)
class Axis:
    """One flag and the values the search may give it, in order (None: the server's default, flag left out)."""

    name: str
    values: tuple[FlagValue | None, ...]


@dataclass(frozen=True)
class Hardware:
    """What the memory model needs: one GPU's memory, or (CPU host) the KV space vLLM is given; for llama-server on
    a CPU host, the memory a trial server may take."""

    gpu_memory_bytes: int | None = None
    cpu_kv_cache_bytes: int | None = None
    host_memory_bytes: int | None = None
    gpu_name: str = ""  # vLLM's batch defaults tell an A100 from other GPUs of its memory


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str
    memory: Mapping[str, Any]
    kind: str = ""  # which check refused it (``PRUNE_KINDS``): the pruned are counted by it


# Why a point is pruned, one key per check, with what widens the search past it (the nothing-to-measure error and
# the grouped table say it).
PRUNE_KINDS = {
    "flag": "a value the flag does not take: fix it in --flags",
    "not_applied": "a flag this server does not apply: it is no candidate of this target",
    "batched_below_seqs": "search larger max_num_batched_tokens or smaller max_num_seqs in --flags",
    "batched_below_len": "keep chunked prefill on, or search max_num_batched_tokens of at least max_model_len",
    "len_below_longest": "search a larger max_model_len in --flags (the model permitting), or lower "
    "max_request_tokens (max_prompt_tokens, max_output_tokens) in the workload file",
    "memory": "give the KV cache more room (managed.env VLLM_CPU_KVCACHE_SPACE on a CPU host, "
    "gpu_memory_utilization in --flags on a GPU) or search a smaller max_model_len",
    "slot_below_longest": "search a larger ctx_size or a smaller parallel in --flags, or lower max_request_tokens "
    "in the workload file",
    "ubatch_above_batch": "search ubatch_size <= batch_size in --flags",
    "host_memory": "search a smaller ctx_size in --flags, or free memory on the host",
}


def _with(values: Sequence[Any], current: Any) -> tuple[Any, ...]:
    """``values`` with ``current`` added; without None (the server's default) when a value is set: a recommendation
    can change a flag but not unset it."""
    out = [v for v in dict.fromkeys(values) if v is not None or current is None]
    if current is not None and current not in out:
        out.append(current)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in out if v is not None):
        out = sorted(out, key=lambda v: -1 if v is None else v)
    return tuple(out)


def _picked(
    backend: str, names: Sequence[str] | None, searchable: Sequence[str]
) -> tuple[list[str], dict[str, tuple[FlagValue, ...]]]:
    """``names`` as given: each ``NAME`` or ``NAME=V1/V2/...`` (values validated: FlagError names a bad one)."""
    given: dict[str, tuple[FlagValue, ...]] = {}
    picked = []
    for item in names or ():
        name, sep, values = item.partition("=")
        name = name.strip()
        if name not in searchable:
            raise FlagError(backend, name, f"not a flag tuner tune searches (choose from {', '.join(searchable)})")
        picked.append(name)
        if sep:
            given[name] = tuple(validate(backend, name, v.strip()) for v in values.split("/") if v.strip())
            if not given[name]:
                raise FlagError(backend, name, f"no values after '=' in {item!r} (write NAME=V1/V2)")
    return picked, given


def axes_for(
    backend: str,
    current: Mapping[str, Any],
    *,
    longest: int,
    model_max_len: int | None,
    on_gpu: bool,
    names: Sequence[str] | None = None,
) -> tuple[Axis, ...]:
    if backend == "vllm":
        return vllm_axes(current, longest=longest, model_max_len=model_max_len, on_gpu=on_gpu, names=names)
    return llama_axes(current, longest=longest, names=names)


def llama_axes(current: Mapping[str, Any], *, longest: int, names: Sequence[str] | None = None) -> tuple[Axis, ...]:
    """The axes of a llama-server search around ``current``; ``names`` as for ``vllm_axes``."""
    picked, given = _picked("llamacpp", names, SEARCHABLE_LLAMA)
    chosen = tuple(picked) if picked else SEARCHABLE_LLAMA
    axes = {
        "parallel": _with([1, 2, 4, 8, 16], current.get("parallel")),
        "ctx_size": _with([c for c in (1024, 2048, 4096, 8192, 16384) if c >= longest], current.get("ctx_size")),
        "batch_size": _with([512, 1024, 2048], current.get("batch_size")),
        "ubatch_size": _with([128, 256, 512], current.get("ubatch_size")),
        "flash_attn": _with(["off", "on"], current.get("flash_attn")),
    }
    return tuple(Axis(n, _with(given[n], current.get(n)) if n in given else axes[n]) for n in chosen)


def vllm_axes(
    current: Mapping[str, Any],
    *,
    longest: int,
    model_max_len: int | None,
    on_gpu: bool,
    names: Sequence[str] | None = None,
) -> tuple[Axis, ...]:
    """The axes of a vLLM search around ``current`` (its values always included). ``names`` picks flags, each
    ``NAME`` or ``NAME=V1/V2/...`` to give its values (validated: FlagError names a bad one)."""
    picked, given = _picked("vllm", names, SEARCHABLE_VLLM)
    chosen = tuple(picked) if picked else tuple(n for n in SEARCHABLE_VLLM if on_gpu or n not in _GPU_ONLY)
    top = int(current.get("max_model_len") or model_max_len or 4096)
    lens = [top]
    size = 128
    while size < top:
        if size >= longest:
            lens.append(size)
        size *= 2
    axes = {
        "max_num_seqs": _with([1, 2, 4, 8, 16, 32, 64, 128, 256], current.get("max_num_seqs")),
        "max_num_batched_tokens": _with(
            [None, 256, 512, 1024, 2048, 4096, 8192, 16384], current.get("max_num_batched_tokens")
        ),
        "enable_prefix_caching": (False, True),
        "enable_chunked_prefill": (True, False),
        "gpu_memory_utilization": _with([0.8, 0.85, 0.9, 0.95], current.get("gpu_memory_utilization")),
        "kv_cache_dtype": ("auto", "fp8"),
        "max_model_len": _with(lens, current.get("max_model_len")),
    }
    return tuple(Axis(n, _with(given[n], current.get(n)) if n in given else axes[n]) for n in chosen)


# The share of prompt tokens in a shared prefix (a workload file's prefix_len / input_len, or the prefix-cache hit
# ratio stored while caching was on) from which prompts count as sharing one.
_SHARED_PREFIX = 0.1


def workload_flags(axes: Sequence[Axis], workload: Workload) -> dict[str, Any]:
    """Flags the workload itself argues for, among the axes searched: prefix caching when the prompts share a
    prefix. The search's gallop carries them on its steps (tuner/tune/search.py): an operator who knows the prompts
    share a 576-token system prompt turns caching on before counting sequences, and a three-trial budget spent on
    max-num-seqs alone never tries it (bench/results/2026-11-23-2328-tune-shared-prefix.md)."""
    names = {a.name: a for a in axes}
    out: dict[str, Any] = {}
    cache = names.get("enable_prefix_caching")
    shared = max(workload.prefix_len / workload.input_len, workload.prefix_hit_ratio or 0.0)
    if cache is not None and True in cache.values and shared >= _SHARED_PREFIX:
        out["enable_prefix_caching"] = True
    return out


def _number(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _first_holding(axis: Axis, want: float) -> int:
    """The smallest number on ``axis`` that is at least ``want``, else its largest."""
    on_axis = sorted(v for v in axis.values if _number(v))
    return next((v for v in on_axis if v >= want), on_axis[-1])


def step_budget(
    backend: str, axes: Sequence[Axis], workload: Workload
) -> Callable[[Mapping[str, Any], Mapping[str, Any]], Mapping[str, Any]] | None:
    """What a gallop step up along max-num-seqs (--parallel) brings along, where both flags are searched and set
    (a budget left to the server's default is the server's to size):

      * vLLM: max-num-batched-tokens, when the tokens one engine step needs with the step's sequences running exceed
        it. A sequence's life is one prefill of its uncached prompt (the shared prefix hits the cache unless the step
        turns caching off) and then one token a step: (uncached + output - 1) / output tokens a step on average. So
        a shape of 256-token prompts and 4-token outputs asks 60 tokens a step a sequence, and 32 sequences on 256
        tokens wait on the budget (tiny-out: 253 req/s at 256 tokens, 358 at 2048), while 751-token prompts sharing
        522 tokens with 80-token outputs ask 4, and 32 sequences never fill 256 (rag: 84.7 req/s at 256, 71.2 at
        2048; bench/results/2026-11-27-1602-tune-corpus.md).
      * llama-server: -c, in proportion to the slots: it splits -c among them, and a slot must hold the longest
        request as the flags in force held it.
    The value taken is the smallest on its axis that holds the need, else its largest."""
    names = {a.name: a for a in axes}
    if backend == "vllm":
        seqs_axis, partner = names.get("max_num_seqs"), names.get("max_num_batched_tokens")
    else:
        seqs_axis, partner = names.get("parallel"), names.get("ctx_size")
    if seqs_axis is None or partner is None or not any(_number(v) for v in partner.values):
        return None
    slots, budget_name = seqs_axis.name, partner.name

    def along(base: Mapping[str, Any], step: Mapping[str, Any]) -> Mapping[str, Any]:
        have, now, budget = base.get(slots), step.get(slots), step.get(budget_name)
        if not _number(have) or not _number(now) or not _number(budget) or now <= have:
            return {}
        if backend != "vllm":
            want = budget * now / have  # as many tokens a slot as in force
        else:
            cached = workload.prefix_len if step.get("enable_prefix_caching") is not False else 0
            out = max(1, workload.output_len)
            want = now * (max(0, workload.input_len - cached) + out - 1) / out
        return {budget_name: _first_holding(partner, want)} if want > budget else {}

    return along


def not_applied(backend: str, flags: Mapping[str, Any]) -> str:
    """Why a trial server of ``backend`` would not run what ``flags`` say (empty when it would): a backend switch is
    no flag of the server (its argv builder drops it), and a trial labelled with it would measure the server it
    has. A llama-server trial needs a GGUF and llama-server's executable; the target's managed section has
    neither, so a switch is no tune candidate: measure it by tuning a llama-server target."""
    other = flags.get("backend")
    if other is not None:
        if other == backend:
            return f"backend={other} is the server it already is: not a flag its argv carries"
        return (
            f"backend {backend} -> {other} is not a tune candidate: a trial of {other} needs {other}'s own "
            f"model file and executable, which this {backend} target does not name; its trial would run "
            f"{backend} with the same flags. Measure it by tuning a managed {other} target"
        )
    return ""


def missing_from_argv(backend: str, flags: Mapping[str, Any], argv: Sequence[str]) -> list[str]:
    """The candidate flags ``argv`` does not carry as the server reads them (empty when each is there): a value
    flag followed by its value, a switch on as itself and off as ``--no-<name>``. Read back from the argv, not from
    the builder: what the server was started with is what it applies."""
    missing = []
    args = list(argv)
    for name, given in canonical(flags).items():
        try:
            flag, value = cli_name(backend, name), validate(backend, name, given)
        except FlagError:
            value = given
            missing.append(f"{name}={value} (not a flag of {backend})")
            continue
        if name == "backend":
            missing.append(f"backend={value} (no server flag)")
            continue
        if not flag.startswith("-"):
            flag = "--" + flag
        if value is True:
            ok = flag in args
        elif value is False:
            ok = "--no-" + flag.lstrip("-") in args
        else:
            text = repr(value) if isinstance(value, float) else str(value)
            ok = any(a == flag and b == text for a, b in zip(args, args[1:]))
        if not ok:
            missing.append(f"{name}={value} ({flag})")
    return missing


def canonical(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The flags with unset (None) entries left out, in a stable order: what a trial is keyed by."""
    return {k: flags[k] for k in sorted(flags) if flags[k] is not None}


def feasible(
    backend: str, flags: Mapping[str, Any], *, model: ModelFacts | None, hardware: Hardware, longest: int
) -> Verdict:
    """Whether a server could start with ``flags`` and serve the workload; see the module docstring."""
    f = canonical(flags)
    foreign = not_applied(backend, f)
    if foreign:
        return Verdict(False, foreign, {}, "not_applied")
    for name, value in f.items():
        try:
            validate(backend, name, value)
        except FlagError as exc:
            return Verdict(False, str(exc), {}, "flag")
    if backend != "vllm":
        return _feasible_llama(f, model=model, hardware=hardware, longest=longest)
    default_seqs, default_batched = vllm_batch_defaults(
        hardware.gpu_memory_bytes, hardware.gpu_name, tensor_parallel_size=int(f.get("tensor_parallel_size") or 1)
    )
    seqs = int(f.get("max_num_seqs") or default_seqs)
    length = int(f.get("max_model_len") or (model.max_position_embeddings if model else None) or 4096)
    chunked = bool(f.get("enable_chunked_prefill", True))
    # left out, vLLM raises its default to max-model-len when chunked prefill is off (never below what it needs)
    batched = int(f.get("max_num_batched_tokens") or (default_batched if chunked else max(default_batched, length)))
    if batched < seqs:
        return Verdict(
            False,
            f"max-num-batched-tokens {batched} < max-num-seqs {seqs}: vLLM refuses to start",
            {},
            "batched_below_seqs",
        )
    if not chunked and batched < length:
        return Verdict(
            False,
            f"max-num-batched-tokens {batched} < max-model-len {length} without chunked prefill: vLLM refuses to start",
            {},
            "batched_below_len",
        )
    if length < longest:
        return Verdict(
            False,
            f"max-model-len {length} < the workload's longest request ({longest} tokens)",
            {},
            "len_below_longest",
        )
    if model is None:
        return Verdict(True, "no model facts: the start-up checks pass, memory unchecked", {})
    memory: MemoryPlan
    try:
        if hardware.gpu_memory_bytes:
            memory = plan(
                model,
                gpu_memory_bytes=hardware.gpu_memory_bytes,
                gpu_memory_utilization=float(f.get("gpu_memory_utilization") or 0.9),
                max_model_len=length,
                kv_cache_dtype=str(f.get("kv_cache_dtype") or "auto"),
                max_num_batched_tokens=batched,
            )
        elif hardware.cpu_kv_cache_bytes:
            memory = plan(
                model,
                gpu_memory_bytes=hardware.cpu_kv_cache_bytes + weights_bytes(model),
                max_model_len=length,
                kv_cache_dtype=str(f.get("kv_cache_dtype") or "auto"),
                kv_cache_memory_bytes=hardware.cpu_kv_cache_bytes,
            )
        else:
            return Verdict(True, "no memory facts (no GPU reading, no CPU KV space): memory unchecked", {})
    except ValueError as exc:
        return Verdict(False, f"memory model cannot plan it: {exc}", {}, "memory")
    brief = {
        "kv_capacity_tokens": memory.kv_capacity_tokens,
        "max_concurrency": round(memory.max_concurrency, 3),
        "weights_bytes": memory.weights_bytes,
        "kv_budget_bytes": memory.kv_budget_bytes,
    }
    if not memory.fits:
        return Verdict(False, f"memory model: {memory.reason}", brief, "memory")
    return Verdict(True, memory.reason, brief)


def _feasible_llama(f: Mapping[str, Any], *, model: ModelFacts | None, hardware: Hardware, longest: int) -> Verdict:
    parallel, ctx = int(f.get("parallel") or 1), int(f.get("ctx_size") or 4096)
    if ctx // parallel < longest:
        return Verdict(
            False,
            f"-c {ctx} over --parallel {parallel} gives each slot {ctx // parallel} tokens, less "
            f"than the workload's longest request ({longest})",
            {},
            "slot_below_longest",
        )
    if int(f.get("ubatch_size") or 512) > int(f.get("batch_size") or 2048):
        return Verdict(
            False, f"-ub {f.get('ubatch_size')} > -b {f.get('batch_size') or 2048}", {}, "ubatch_above_batch"
        )
    if model is None or not hardware.host_memory_bytes:
        return Verdict(True, "no model or host memory facts: the slot checks pass, memory unchecked", {})
    kv = ctx * kv_bytes_per_token(model, "float16")  # llama-server's default KV type
    need = (model.checkpoint_bytes or weights_bytes(model)) + kv + _LLAMA_RUNTIME_BYTES
    brief = {"kv_bytes": kv, "need_bytes": need, "host_memory_bytes": hardware.host_memory_bytes}
    if need > hardware.host_memory_bytes:
        return Verdict(
            False,
            f"weights + {ctx} tokens of KV + buffers = {need / 2**30:.2f} GiB, more than the "
            f"{hardware.host_memory_bytes / 2**30:.2f} GiB a trial server may take",
            brief,
            "host_memory",
        )
    return Verdict(True, f"{need / 2**30:.2f} GiB of {hardware.host_memory_bytes / 2**30:.2f} GiB", brief)
