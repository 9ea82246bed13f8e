"""The memory model: does a model fit a GPU at given flags, and how many tokens of KV cache are left?

Per GPU, with tensor-parallel size tp (as vLLM sizes it):

    weights_per_gpu  = weights_bytes / tp
    kv_bytes/token   = 2 (K and V) x layers x kv_heads x head_dim x kv_dtype_bytes          (whole model)
    per GPU          = 2 x layers x max(1, kv_heads / tp) x head_dim x kv_dtype_bytes   (KV heads split, or replicated)
    overhead         = 1 GiB (CUDA context, allocator, CUDA graphs) + activations of one step
    activations      = max_num_batched_tokens x (4 x hidden + 2 x intermediate / tp) x 2 bytes
    kv_budget        = gpu_memory x gpu_memory_utilization - weights_per_gpu - overhead
                       (or --kv-cache-memory-bytes, which makes vLLM skip that arithmetic)
    blocks           = floor(kv_budget / (block_size x kv bytes/token per GPU));  tokens = blocks x block_size
    max_concurrency  = tokens / max_model_len       (vLLM's kv_cache_max_concurrency)
    fits             = kv_budget > 0 and tokens >= max_model_len   (vLLM refuses to start otherwise)

A running vLLM's memory, broken down (``breakdown``): the weights and the overhead from this model; the KV cache
allocated from the server's own report (``vllm:cache_config_info``: num_gpu_blocks x block_size x the KV bytes of a
token, or its kv_cache_memory_bytes when the model is not known), and in use (that times ``kv_cache_usage_perc``).

Weights: unquantized checkpoints take 2 bytes a parameter at run time (vLLM serves float32 checkpoints in
16-bit by default); fp8/int8 take 1; AWQ/GPTQ take bits/8 plus a 16-bit scale and a packed zero per group
for the projection weights, while embeddings and the output head stay 16-bit. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tuner.advise.facts import DTYPE_BYTES, ModelFacts
from tuner.backends import kv_block_size

__all__ = [
    "vllm_batch_defaults",
    "MemoryPlan",
    "plan",
    "weights_bytes",
    "kv_bytes_per_token",
    "OVERHEAD_FIXED_BYTES",
    "GIB",
    "MemoryBreakdown",
    "breakdown",
    "overhead_bytes",
]

GIB = 2**30
OVERHEAD_FIXED_BYTES = 1 * GIB
_ACT_BYTES = 2
_KV_DTYPE_BYTES = {
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
    "float16": 2,
    "bfloat16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
}


@dataclass(frozen=True)
class MemoryPlan:
    """Result of ``plan``. Bytes are per GPU unless the name says otherwise."""

    weights_bytes: int  # whole model
    weights_bytes_per_gpu: int
    kv_bytes_per_token: int  # whole model
    kv_bytes_per_token_per_gpu: int
    overhead_bytes: int  # per GPU: fixed + activations (0 when --kv-cache-memory-bytes sizes the cache)
    gpu_memory_bytes: int  # one GPU
    gpu_memory_utilization: float
    kv_budget_bytes: int  # per GPU, may be negative: then nothing fits
    block_size: int
    kv_blocks: int
    kv_capacity_tokens: int
    max_model_len: int
    max_concurrency: float  # full-length sequences the KV cache holds at once
    kv_bytes_per_sequence: int  # whole model, one max_model_len sequence
    tensor_parallel_size: int
    kv_cache_dtype: str
    quantization: str | None
    fits: bool
    reason: str  # why it fits or not, in one line

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def weights_bytes(model: ModelFacts, quantization: str | None = None) -> int:
    """Bytes of the weights at run time under ``quantization`` (None: the checkpoint's own)."""
    method = (quantization or model.quantization or "").lower()
    if model.checkpoint_bytes is not None and method == (model.quantization or "").lower():
        # What is stored is what gets loaded; float32 checkpoints are served in 16 bits.
        four_byte = not method and DTYPE_BYTES.get(model.dtype, 2) == 4
        return model.checkpoint_bytes // 2 if four_byte else model.checkpoint_bytes
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "bitsandbytes"):
        bits = model.quant_bits or 4
        group = model.quant_group_size or 128
        per_param = bits / 8 + (2 + bits / 8) / group  # packed weight + fp16 scale + packed zero per group
        return int(model.linear_params * per_param) + (model.params - model.linear_params) * 2
    if method in ("fp8", "int8", "w8a8", "compressed-tensors"):
        return model.linear_params + (model.params - model.linear_params) * 2
    return model.params * 2


def kv_dtype_bytes(model: ModelFacts, kv_cache_dtype: str) -> int:
    if kv_cache_dtype in ("auto", ""):
        return min(2, DTYPE_BYTES.get(model.dtype, 2))  # the serving dtype: 16-bit for float32 checkpoints
    try:
        return _KV_DTYPE_BYTES[kv_cache_dtype]
    except KeyError:
        raise ValueError(
            f"kv cache dtype {kv_cache_dtype!r}: expected auto, fp8, fp8_e4m3, fp8_e5m2, float16 or bfloat16"
        ) from None


def kv_bytes_per_token(model: ModelFacts, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1) -> int:
    heads = model.num_kv_heads if tensor_parallel_size == 1 else max(1, model.num_kv_heads // tensor_parallel_size)
    return 2 * model.num_layers * heads * model.head_dim * kv_dtype_bytes(model, kv_cache_dtype)


def _overhead(model: ModelFacts, tensor_parallel_size: int, max_num_batched_tokens: int | None) -> int:
    """Fixed (CUDA context, allocator, graphs) plus the activations of one step, per GPU."""
    batched = max_num_batched_tokens or 8192  # vLLM's default step budget with chunked prefill
    activations = batched * (4 * model.hidden_size + 2 * model.intermediate_size // tensor_parallel_size) * _ACT_BYTES
    return OVERHEAD_FIXED_BYTES + activations


def overhead_bytes(model: ModelFacts, tensor_parallel_size: int = 1, max_num_batched_tokens: int | None = None) -> int:
    """The memory model's runtime overhead per GPU (what ``plan`` takes away before the KV cache)."""
    return _overhead(model, tensor_parallel_size, max_num_batched_tokens)


def plan(
    model: ModelFacts,
    *,
    gpu_memory_bytes: int,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    quantization: str | None = None,
    block_size: int = 16,
    max_num_batched_tokens: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    overhead_bytes: int | None = None,
) -> MemoryPlan:
    """The memory plan of ``model`` on GPUs of ``gpu_memory_bytes`` each; ValueError names a bad argument."""
    if gpu_memory_bytes <= 0:
        raise ValueError(f"gpu memory must be positive, got {gpu_memory_bytes} bytes")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu-memory-utilization must be in (0, 1], got {gpu_memory_utilization}")
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor-parallel-size must be >= 1, got {tensor_parallel_size}")
    if block_size < 1:
        raise ValueError(f"block size must be >= 1, got {block_size}")
    length = max_model_len or model.max_position_embeddings or 4096
    if length < 1:
        raise ValueError(f"max-model-len must be >= 1, got {length}")
    tp = tensor_parallel_size
    weights = weights_bytes(model, quantization)
    per_gpu = math.ceil(weights / tp)
    kv_tok = kv_bytes_per_token(model, kv_cache_dtype)
    kv_tok_gpu = kv_bytes_per_token(model, kv_cache_dtype, tp)
    if kv_cache_memory_bytes is not None:
        overhead = 0 if overhead_bytes is None else overhead_bytes
        budget = kv_cache_memory_bytes
    else:
        overhead = _overhead(model, tp, max_num_batched_tokens) if overhead_bytes is None else overhead_bytes
        budget = int(gpu_memory_bytes * gpu_memory_utilization) - per_gpu - overhead
    blocks = max(0, budget // (block_size * kv_tok_gpu))
    tokens = blocks * block_size
    if per_gpu + overhead > gpu_memory_bytes * gpu_memory_utilization and kv_cache_memory_bytes is None:
        fits, reason = (
            False,
            (
                f"weights {per_gpu / GIB:.2f} GiB + overhead {overhead / GIB:.2f} GiB per GPU exceed "
                f"{gpu_memory_utilization:g} x {gpu_memory_bytes / GIB:.2f} GiB"
            ),
        )
    elif tokens < length:
        fits, reason = False, (f"KV cache holds {tokens} tokens, fewer than one max-model-len sequence ({length})")
    elif kv_cache_memory_bytes is not None and per_gpu + kv_cache_memory_bytes > gpu_memory_bytes:
        fits, reason = False, "weights plus --kv-cache-memory-bytes exceed the GPU's memory"
    else:
        fits, reason = True, (f"KV cache holds {tokens} tokens = {tokens / length:.2f} sequences of {length}")
    return MemoryPlan(
        weights_bytes=weights,
        weights_bytes_per_gpu=per_gpu,
        kv_bytes_per_token=kv_tok,
        kv_bytes_per_token_per_gpu=kv_tok_gpu,
        overhead_bytes=overhead,
        gpu_memory_bytes=gpu_memory_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_budget_bytes=budget,
        block_size=block_size,
        kv_blocks=blocks,
        kv_capacity_tokens=tokens,
        max_model_len=length,
        max_concurrency=tokens / length,
        kv_bytes_per_sequence=kv_tok * length,
        tensor_parallel_size=tp,
        kv_cache_dtype=kv_cache_dtype,
        quantization=quantization or model.quantization,
        fits=fits,
        reason=reason,
    )


@dataclass(frozen=True)
class MemoryBreakdown:
    """Where a running server's memory goes, bytes per GPU; None where neither the server nor the model says."""

    weights_bytes: int | None  # the memory model's, at run time
    kv_cache_allocated_bytes: int | None  # what the server sized its KV cache to
    kv_cache_used_bytes: int | None  # allocated x the server's KV use now
    overhead_bytes: int | None  # the memory model's runtime overhead (context, allocator, graphs, activations)
    kv_source: str  # how allocated was read: "blocks" (num_gpu_blocks x block_size x KV bytes/token) | "budget"
    #                 (cache_config_info's kv_cache_memory_bytes) | "" (not known)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _int(text: Any) -> int | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return int(value) if math.isfinite(value) and value >= 0 else None


def breakdown(
    config: Mapping[str, str],
    kv_usage: float | None,
    model: ModelFacts | None,
    *,
    tensor_parallel_size: int = 1,
    quantization: str | None = None,
    max_num_batched_tokens: int | None = None,
) -> MemoryBreakdown:
    """A running vLLM's memory from its ``vllm:cache_config_info`` labels (``config``), its KV use (fraction 0-1)
    and, when tuner knows it, the model it serves."""
    tp = max(1, tensor_parallel_size)
    blocks, block_size = _int(config.get("num_gpu_blocks")), kv_block_size(config)
    allocated, source = None, ""
    if model is not None and blocks is not None and block_size:
        dtype = config.get("cache_dtype") or "auto"
        try:
            per_token = kv_bytes_per_token(model, dtype, tp)
        except ValueError:  # a cache dtype the model does not know: the server's own budget below
            per_token = None
        if per_token is not None:
            allocated, source = blocks * block_size * per_token, "blocks"
    if allocated is None and _int(config.get("kv_cache_memory_bytes")) is not None:
        allocated, source = _int(config.get("kv_cache_memory_bytes")), "budget"
    used = int(allocated * kv_usage) if allocated is not None and kv_usage is not None else None
    weights = math.ceil(weights_bytes(model, quantization) / tp) if model is not None else None
    overhead = _overhead(model, tp, max_num_batched_tokens) if model is not None else None
    return MemoryBreakdown(weights, allocated, used, overhead, source)


def vllm_batch_defaults(
    gpu_memory_bytes: int | None, gpu_name: str = "", *, tensor_parallel_size: int = 1
) -> tuple[int, int]:
    """What vLLM's API server takes for max-num-seqs and max-num-batched-tokens when neither flag is given, as
    vLLM 0.11-0.32 decides it (``EngineArgs.get_batch_defaults``): on a CPU host (no GPU memory) 128 and 2048, each
    times the tensor-parallel size; on a GPU of 160 GiB or more 1024 and 16384; of 70 GiB or more, an A100 aside,
    1024 and 8192; on any other GPU 256 and 2048. "Left out" must read as the number the server will use: start-up
    checks compare the two, the advisor halves the first, and a capacity search sizes its steps by it."""
    if not gpu_memory_bytes:
        return 128 * tensor_parallel_size, 2048 * tensor_parallel_size
    if gpu_memory_bytes >= 160 * GIB:
        return 1024, 16384
    if gpu_memory_bytes >= 70 * GIB and "a100" not in gpu_name.lower():
        return 1024, 8192
    return 256, 2048
