"""Applying flags to real servers: argv builders, environments and a supervised server process.

Launch specs are plain argv lists (never shell strings); flag names and values are validated before use.
"""

from tuner.apply.launch import (
    FlagValue,
    ServerProcess,
    ServerStartError,
    free_port,
    llama_server_argv,
    vllm_argv,
    vllm_cpu_env,
)

__all__ = [
    "FlagValue",
    "ServerProcess",
    "ServerStartError",
    "free_port",
    "llama_server_argv",
    "vllm_argv",
    "vllm_cpu_env",
]
