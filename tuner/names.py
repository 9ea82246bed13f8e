"""Names as data: the words tuner writes in more than one module, each spelled once.

``StrEnum`` is the base of tuner's vocabularies (an apply's outcome and state in store/journal.py, a
recommendation's status in store/recommendations.py, an alert's state in rules/state.py, a trial's status in
store/tuning.py). ``enum.StrEnum`` is Python 3.11+; this one runs on 3.10 and its members are their strings in every
way tuner shows them: equal, same hash, ``str()``, ``format()``/f-strings, ``repr()``, ``json.dumps`` and a database
bind all give exactly the bare string, so a stored row, a JSON answer or a log line does not change by one byte.

The engine metric names below are the canonical names of ``tuner/collect/catalogue.py``, which builds its table from
them (kind, unit, aliases, snapshot field). They live here, under every layer, so that a stage the layer contracts keep
away from ``tuner.collect`` (the rules, the advisor, backends.py) reads the same name rather than typing it again;
``tests/test_names.py`` fails on an engine metric name typed anywhere else in tuner/.
"""

from __future__ import annotations

from enum import Enum
from typing import Final


class StrEnum(str, Enum):
    """A vocabulary whose members are their values wherever they are shown (see the module docstring)."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(str.__str__(self), spec)

    def __repr__(self) -> str:
        return str.__repr__(str.__str__(self))


# The engine metric prefixes, as the servers write them.
VLLM_PREFIX: Final = "vllm:"
LLAMACPP_PREFIX: Final = "llamacpp:"

# vLLM
VLLM_NUM_REQUESTS_RUNNING: Final = "vllm:num_requests_running"
VLLM_NUM_REQUESTS_WAITING: Final = "vllm:num_requests_waiting"
VLLM_NUM_REQUESTS_WAITING_BY_REASON: Final = "vllm:num_requests_waiting_by_reason"
VLLM_KV_CACHE_USAGE_PERC: Final = "vllm:kv_cache_usage_perc"
VLLM_ENGINE_SLEEP_STATE: Final = "vllm:engine_sleep_state"
VLLM_NUM_PREEMPTIONS_TOTAL: Final = "vllm:num_preemptions_total"
VLLM_PROMPT_TOKENS_TOTAL: Final = "vllm:prompt_tokens_total"
VLLM_GENERATION_TOKENS_TOTAL: Final = "vllm:generation_tokens_total"
VLLM_PROMPT_TOKENS_CACHED_TOTAL: Final = "vllm:prompt_tokens_cached_total"
VLLM_PREFIX_CACHE_QUERIES_TOTAL: Final = "vllm:prefix_cache_queries_total"
VLLM_PREFIX_CACHE_HITS_TOTAL: Final = "vllm:prefix_cache_hits_total"
VLLM_REQUEST_SUCCESS_TOTAL: Final = "vllm:request_success_total"
VLLM_ADMISSION_REJECTIONS_TOTAL: Final = "vllm:admission_rejections_total"
VLLM_TIME_TO_FIRST_TOKEN_SECONDS: Final = "vllm:time_to_first_token_seconds"
VLLM_INTER_TOKEN_LATENCY_SECONDS: Final = "vllm:inter_token_latency_seconds"
VLLM_REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS: Final = "vllm:request_time_per_output_token_seconds"
VLLM_E2E_REQUEST_LATENCY_SECONDS: Final = "vllm:e2e_request_latency_seconds"
VLLM_REQUEST_QUEUE_TIME_SECONDS: Final = "vllm:request_queue_time_seconds"
VLLM_REQUEST_INFERENCE_TIME_SECONDS: Final = "vllm:request_inference_time_seconds"
VLLM_REQUEST_PREFILL_TIME_SECONDS: Final = "vllm:request_prefill_time_seconds"
VLLM_REQUEST_DECODE_TIME_SECONDS: Final = "vllm:request_decode_time_seconds"
VLLM_REQUEST_PROMPT_TOKENS: Final = "vllm:request_prompt_tokens"
VLLM_REQUEST_GENERATION_TOKENS: Final = "vllm:request_generation_tokens"
VLLM_ITERATION_TOKENS_TOTAL: Final = "vllm:iteration_tokens_total"
VLLM_REQUEST_MAX_NUM_GENERATION_TOKENS: Final = "vllm:request_max_num_generation_tokens"
VLLM_REQUEST_PARAMS_MAX_TOKENS: Final = "vllm:request_params_max_tokens"
VLLM_REQUEST_NUM_PREEMPTIONS: Final = "vllm:request_num_preemptions"
VLLM_CACHE_CONFIG_INFO: Final = "vllm:cache_config_info"

# llama-server
LLAMACPP_PROMPT_TOKENS_TOTAL: Final = "llamacpp:prompt_tokens_total"
LLAMACPP_PROMPT_TOKENS_CACHED_TOTAL: Final = "llamacpp:prompt_tokens_cached_total"
LLAMACPP_PROMPT_SECONDS_TOTAL: Final = "llamacpp:prompt_seconds_total"
LLAMACPP_TOKENS_PREDICTED_TOTAL: Final = "llamacpp:tokens_predicted_total"
LLAMACPP_TOKENS_PREDICTED_SECONDS_TOTAL: Final = "llamacpp:tokens_predicted_seconds_total"
LLAMACPP_N_DECODE_TOTAL: Final = "llamacpp:n_decode_total"
LLAMACPP_N_TOKENS_MAX: Final = "llamacpp:n_tokens_max"
LLAMACPP_SPEC_DECODE_NUM_DRAFT_TOKENS_TOTAL: Final = "llamacpp:spec_decode_num_draft_tokens_total"
LLAMACPP_SPEC_DECODE_NUM_ACCEPTED_TOKENS_TOTAL: Final = "llamacpp:spec_decode_num_accepted_tokens_total"
LLAMACPP_SPEC_DECODE_NUM_DRAFTS_TOTAL: Final = "llamacpp:spec_decode_num_drafts_total"
LLAMACPP_PROMPT_TOKENS_SECONDS: Final = "llamacpp:prompt_tokens_seconds"
LLAMACPP_PREDICTED_TOKENS_SECONDS: Final = "llamacpp:predicted_tokens_seconds"
LLAMACPP_REQUESTS_PROCESSING: Final = "llamacpp:requests_processing"
LLAMACPP_REQUESTS_DEFERRED: Final = "llamacpp:requests_deferred"
LLAMACPP_N_BUSY_SLOTS_PER_DECODE: Final = "llamacpp:n_busy_slots_per_decode"
LLAMACPP_KV_CACHE_USAGE_RATIO: Final = "llamacpp:kv_cache_usage_ratio"
LLAMACPP_KV_CACHE_TOKENS: Final = "llamacpp:kv_cache_tokens"
