"""Typed inputs of the advisor: model facts, GPU facts, server facts, current flags, observed workload.

The readers of files (config.json, safetensors headers, GGUF metadata) live here; they raise ModelFactsError
naming the file. ``observe`` turns a stored window into the few workload figures the rules need. Nothing here
reads a clock or the network: the CLI gathers live data and passes it in.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuner.errors import ModelFactsError
from tuner.names import (
    LLAMACPP_N_TOKENS_MAX,
    LLAMACPP_REQUESTS_DEFERRED,
    LLAMACPP_REQUESTS_PROCESSING,
    VLLM_KV_CACHE_USAGE_PERC,
    VLLM_NUM_PREEMPTIONS_TOTAL,
    VLLM_NUM_REQUESTS_RUNNING,
    VLLM_NUM_REQUESTS_WAITING,
    VLLM_REQUEST_GENERATION_TOKENS,
    VLLM_REQUEST_PROMPT_TOKENS,
)
from tuner.signals.derive import quantile
from tuner.signals.promql import bucket_increase
from tuner.store.window import EngineWindow, GpuLatest

__all__ = [
    "ModelFacts",
    "GpuFacts",
    "ServerFacts",
    "Observed",
    "load_model",
    "model_from_config",
    "gpu_facts",
    "observe",
    "flags_from_live_config",
    "FP8_GPUS",
    "DTYPE_BYTES",
]

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "int8": 1}
# GPUs with native FP8 (compute capability >= 8.9): Ada, Hopper, Blackwell. Matched as substrings of the NVML name.
FP8_GPUS = ("H100", "H200", "H20", "H800", "L40", "L4", "RTX 40", "RTX 6000 Ada", "B100", "B200", "GB200", "RTX 50")
# GGUF file types (llama_ftype) → bits per weight, roughly (block scales included); for display only.
_GGUF_FTYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    32: "BF16",
}


@dataclass(frozen=True)
class ModelFacts:
    """What the memory model needs to know about a model. Sizes in bytes, counts in units."""

    source: str  # the path read
    architecture: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    num_experts: int = 1  # 1 for dense models
    max_position_embeddings: int | None = None
    dtype: str = "bfloat16"  # checkpoint dtype
    quantization: str | None = None  # awq | gptq | fp8 | a GGUF type like Q4_K_M; None: unquantized
    quant_bits: int | None = None
    quant_group_size: int | None = None
    checkpoint_bytes: int | None = None  # tensor bytes of the safetensors, or the GGUF file size
    is_embedding: bool = False  # an embedding model, not a generator

    @property
    def embedding_params(self) -> int:
        """Input embedding plus output head (once when tied): kept 16-bit by AWQ/GPTQ/FP8 checkpoints."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def linear_params(self) -> int:
        """Weights of the attention and MLP projections of all layers (what quantization shrinks)."""
        q_out = self.num_attention_heads * self.head_dim
        attn = self.hidden_size * q_out * 2 + self.hidden_size * self.num_kv_heads * self.head_dim * 2
        mlp = 3 * self.hidden_size * self.intermediate_size * self.num_experts  # gate, up, down
        router = self.hidden_size * self.num_experts if self.num_experts > 1 else 0
        return self.num_layers * (attn + mlp + router)

    @property
    def params(self) -> int:
        norms = self.num_layers * 2 * self.hidden_size + self.hidden_size
        return self.embedding_params + self.linear_params + norms

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "params": self.params}


@dataclass(frozen=True)
class GpuFacts:
    """The GPUs a target runs on, as NVML last saw them. ``vendor`` "none" is a host without a GPU."""

    vendor: str  # nvidia | amd | none
    count: int = 0
    name: str = ""
    memory_total_bytes: int | None = None  # one GPU
    memory_used_bytes: int | None = None  # one GPU, by everything on it
    other_processes: int = 0  # processes on the GPU other than the server
    other_used_bytes: int = 0  # their memory
    fp8: bool = False  # native FP8 (compute capability >= 8.9)

    @property
    def memory_free_bytes(self) -> int | None:
        if self.memory_total_bytes is None or self.memory_used_bytes is None:
            return None
        return self.memory_total_bytes - self.memory_used_bytes


@dataclass(frozen=True)
class ServerFacts:
    """The running server's version (vLLM GET /version; llama-server /props build_info) and --help options."""

    version: tuple[int, ...] | None = None
    help_options: frozenset[str] | None = None


@dataclass(frozen=True)
class Observed:
    """Workload figures over the window that EngineSignals does not carry. None: not enough data."""

    running_max: float | None = None
    waiting_max: float | None = None
    kv_usage_max: float | None = None
    preemptions: float | None = None  # increase over the window
    prompt_p99: float | None = None  # tokens per request
    generation_p99: float | None = None
    mean_request_tokens: float | None = None  # prompt + generation, per finished request
    requests: float | None = None  # finished in the window
    slot_context_tokens: float | None = None  # llama-server: n_ctx of one slot
    slots_total: float | None = None
    slots_busy_max: float | None = None
    deferred_max: float | None = None
    max_request_tokens: float | None = None  # llama-server: largest prompt+output seen (n_tokens_max)

    @property
    def request_p99_tokens(self) -> float | None:
        """Prompt P99 plus generation P99: an upper estimate of P99 prompt+output (the quantiles need not coincide)."""
        if self.prompt_p99 is None or self.generation_p99 is None:
            return None
        return self.prompt_p99 + self.generation_p99


def _max_of(e: EngineWindow, metric: str) -> float | None:
    found = [v for (name, _), pts in e.series.items() if name == metric for _, v in pts]
    return max(found) if found else None


def _increase(e: EngineWindow, metric: str, lo: int, hi: int) -> float | None:
    """The counter's exact rise between the window's first and last stored points (a reset restarts from 0).

    Not PromQL's extrapolated increase(): evidence says "3 preemptions", the count the server reported.
    """
    found = [[v for ts, v in pts if lo <= ts <= hi] for (name, _), pts in e.series.items() if name == metric]
    found = [vals for vals in found if len(vals) >= 2]
    if not found:
        return None
    return math.fsum(b - a if b >= a else b for vals in found for a, b in zip(vals, vals[1:]))


def _hist_mean_sum(e: EngineWindow, metric: str, lo: int, hi: int) -> tuple[float, float] | None:
    """(observations, sum) over the window from the histogram's _count/_sum points (plain differences)."""
    h = e.hists.get((metric, ()))
    if h is None:
        return None
    pts = [p for p in h.points if lo <= p.ts_ms <= hi]
    if len(pts) < 2:
        return None
    return pts[-1].count - pts[0].count, pts[-1].sum - pts[0].sum


def observe(e: EngineWindow, backend: str, start_ms: int, end_ms: int) -> Observed:
    """The workload figures of one engine over [start_ms, end_ms], from its stored series."""
    if backend == "vllm":
        prompt = _hist_mean_sum(e, VLLM_REQUEST_PROMPT_TOKENS, start_ms, end_ms)
        gen = _hist_mean_sum(e, VLLM_REQUEST_GENERATION_TOKENS, start_ms, end_ms)
        mean = None
        if prompt and gen and prompt[0] > 0:
            mean = (prompt[1] + gen[1]) / prompt[0]
        return Observed(
            running_max=_max_of(e, VLLM_NUM_REQUESTS_RUNNING),
            waiting_max=_max_of(e, VLLM_NUM_REQUESTS_WAITING),
            kv_usage_max=_max_of(e, VLLM_KV_CACHE_USAGE_PERC),
            preemptions=_increase(e, VLLM_NUM_PREEMPTIONS_TOTAL, start_ms, end_ms),
            prompt_p99=quantile(e, VLLM_REQUEST_PROMPT_TOKENS, 0.99, start_ms, end_ms),
            generation_p99=quantile(e, VLLM_REQUEST_GENERATION_TOKENS, 0.99, start_ms, end_ms),
            mean_request_tokens=mean,
            requests=prompt[0] if prompt else None,
        )
    return Observed(
        running_max=_max_of(e, LLAMACPP_REQUESTS_PROCESSING),
        waiting_max=_max_of(e, LLAMACPP_REQUESTS_DEFERRED),
        deferred_max=_max_of(e, LLAMACPP_REQUESTS_DEFERRED),
        kv_usage_max=_max_of(e, "tuner:kv_cache_usage"),
        slot_context_tokens=_max_of(e, "tuner:slot_context_tokens"),
        slots_total=_max_of(e, "tuner:slots_total"),
        slots_busy_max=_max_of(e, "tuner:slots_busy"),
        max_request_tokens=_max_of(e, LLAMACPP_N_TOKENS_MAX),
    )


def _bucket_total(e: EngineWindow, metric: str, lo: int, hi: int) -> float | None:
    h = e.hists.get((metric, ()))
    inc = bucket_increase(h, lo, hi) if h else None
    return inc[-1] if inc else None


def flags_from_live_config(backend: str, config: Mapping[str, str]) -> dict[str, Any]:
    """Current flags the server itself reports: vLLM's cache_config_info labels, llama-server's /props."""
    out: dict[str, Any] = {}
    if backend == "vllm":
        if _num(config.get("gpu_memory_utilization")) is not None:
            out["gpu_memory_utilization"] = float(config["gpu_memory_utilization"])
        if config.get("enable_prefix_caching") in ("True", "False"):
            out["enable_prefix_caching"] = config["enable_prefix_caching"] == "True"
        if config.get("cache_dtype"):
            out["kv_cache_dtype"] = config["cache_dtype"]
        tokens, conc = _num(config.get("kv_cache_size_tokens")), _num(config.get("kv_cache_max_concurrency"))
        if tokens and conc:
            # vLLM reports max concurrency as KV tokens / max_model_len.
            out["max_model_len"] = int(round(tokens / conc))
    else:
        # The slot count only. /props' n_ctx is one slot's context: -c / N with a buffer per slot (--parallel N),
        # but all of -c on the one buffer a server started without --parallel runs (both capped at the model's
        # training context), and /props does not say which. So -c is not read back from it: slots x n_ctx was 4x
        # the real -c of a default server, and a rule that split it would have proposed slots too small to hold
        # the requests. Rules take -c from the command line or the config, else one slot's n_ctx as its least value.
        slots = _num(config.get("total_slots"))
        if slots:
            out["parallel"] = int(slots)
    return out


def _num(text: object) -> float | None:
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def gpu_facts(
    latest: list[GpuLatest], server_pids: frozenset[int] = frozenset(), vendor: str | None = None
) -> GpuFacts:
    """GpuFacts from the store's latest NVML reading; no reading means no GPU (vendor "none") unless told."""
    if not latest:
        return GpuFacts(vendor=vendor or "none")
    g = latest[0]
    others = [p for p in g.processes if p[0] not in server_pids]
    # Without the server's pids every process counts as "other" only when there are two or more.
    if not server_pids and len(g.processes) <= 1:
        others = []
    return GpuFacts(
        vendor=vendor or "nvidia",
        count=len(latest),
        name=g.name,
        memory_total_bytes=g.memory_total_bytes,
        memory_used_bytes=g.memory_used_bytes,
        other_processes=len(others),
        other_used_bytes=sum(p[2] or 0 for p in others),
        fp8=any(tag in g.name for tag in FP8_GPUS),
    )


# ---- model files ---------------------------------------------------------------------------------


def model_from_config(cfg: Mapping[str, Any], source: str, checkpoint_bytes: int | None = None) -> ModelFacts:
    """ModelFacts from a Hugging Face config.json mapping; ModelFactsError names the missing key."""
    inner = cfg.get("text_config")
    text: Mapping[str, Any] = inner if isinstance(inner, dict) else cfg

    def need(*keys: str) -> int:
        for k in keys:
            if isinstance(text.get(k), int) and not isinstance(text.get(k), bool):
                return int(text[k])
        raise ModelFactsError(
            source, f"config.json has no integer {' / '.join(keys)}; is this a decoder model's config?"
        )

    layers = need("num_hidden_layers", "n_layer", "num_layers")
    hidden = need("hidden_size", "n_embd", "d_model")
    heads = need("num_attention_heads", "n_head")
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or hidden // heads)
    inter = int(text.get("intermediate_size") or text.get("moe_intermediate_size") or 4 * hidden)
    quant = cfg.get("quantization_config") or {}
    method = quant.get("quant_method")
    bits = quant.get("bits") or quant.get("w_bit") or ({"fp8": 8}.get(method or ""))
    archs = cfg.get("architectures") or [cfg.get("model_type", "unknown")]
    arch = str(archs[0])
    return ModelFacts(
        source=source,
        architecture=arch,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=need("vocab_size"),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
        num_experts=int(text.get("num_local_experts") or text.get("num_experts") or 1),
        max_position_embeddings=text.get("max_position_embeddings"),
        dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or text.get("torch_dtype") or "bfloat16"),
        quantization=method,
        quant_bits=int(bits) if bits else None,
        quant_group_size=quant.get("group_size") or quant.get("q_group_size"),
        checkpoint_bytes=checkpoint_bytes,
        is_embedding=any(a.endswith(("Model", "ForSequenceClassification")) and "CausalLM" not in a for a in archs),
    )


def load_model(path: str | Path) -> ModelFacts:
    """Facts from a model directory (config.json [+ *.safetensors]), a config.json, or a .gguf file."""
    p = Path(path)
    if p.suffix == ".gguf" and p.is_file():
        return _from_gguf(p)
    config = p / "config.json" if p.is_dir() else p
    if not config.is_file():
        raise ModelFactsError(str(p), "expected a model directory with config.json, a config.json, or a .gguf")
    try:
        cfg = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFactsError(str(config), f"cannot read as JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise ModelFactsError(str(config), "expected a JSON object")
    files = sorted(config.parent.glob("*.safetensors")) if p.is_dir() else []
    size = sum(_safetensors_bytes(f) for f in files) if files else None
    return model_from_config(cfg, str(config), size)


def _safetensors_bytes(path: Path) -> int:
    """Tensor bytes of a safetensors file, from its header (8-byte length, then JSON with data_offsets)."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 * 2**20:
                raise ValueError(f"header of {n} bytes")
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error) as exc:
        raise ModelFactsError(str(path), f"not a readable safetensors file: {exc}") from None
    return sum(t["data_offsets"][1] - t["data_offsets"][0] for k, t in header.items() if k != "__metadata__")


def _from_gguf(path: Path) -> ModelFacts:
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
    except Exception as exc:  # gguf raises ValueError/struct errors on anything malformed
        raise ModelFactsError(str(path), f"not a readable GGUF file: {exc}") from None

    def value(key: str) -> Any:
        f = reader.fields.get(key)
        if f is None:
            return None
        if len(f.data) == 1:
            part = f.parts[f.data[0]]
            return bytes(part).decode() if f.types and f.types[0].name == "STRING" else part.tolist()[0]
        return len(f.data)  # arrays: their length (e.g. the vocabulary)

    arch = value("general.architecture")
    if not arch:
        raise ModelFactsError(str(path), "GGUF has no general.architecture")

    def need(key: str) -> int:
        v = value(f"{arch}.{key}")
        if v is None:
            raise ModelFactsError(str(path), f"GGUF has no {arch}.{key}")
        return int(v)

    heads = need("attention.head_count")
    hidden = need("embedding_length")
    ftype = value("general.file_type")
    return ModelFacts(
        source=str(path),
        architecture=str(arch),
        num_layers=need("block_count"),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=int(value(f"{arch}.attention.head_count_kv") or heads),
        head_dim=int(value(f"{arch}.attention.key_length") or hidden // heads),
        intermediate_size=int(value(f"{arch}.feed_forward_length") or 4 * hidden),
        vocab_size=int(value("tokenizer.ggml.tokens") or value(f"{arch}.vocab_size") or 0),
        tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        max_position_embeddings=value(f"{arch}.context_length"),
        dtype="float16",
        quantization=_GGUF_FTYPES.get(int(ftype), f"ftype {ftype}") if ftype is not None else None,
        checkpoint_bytes=path.stat().st_size,
        is_embedding=bool(value(f"{arch}.pooling_type")),
    )
