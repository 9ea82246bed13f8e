"""The flags tuner may change, declared once: type, bounds, each backend's spelling, oldest server that has it.

The advisor proposes only these, the safety filter checks every proposed value with ``validate``, and the
argv builders (``tuner/apply/launch.py``) can render them with ``render``. Anything not here is never touched.
No value may start with '-': it would read as another option on the server's command line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tuner.backends import BACKENDS as _KNOWN
from tuner.backends import backend as backend_of
from tuner.errors import FlagError

__all__ = [
    "FlagSpec",
    "FLAGS",
    "FlagValue",
    "spec",
    "validate",
    "cli_name",
    "render",
    "supported",
    "tunable_spelled",
    "secret_flag",
    "redact_argv",
    "redact_argv_text",
    "REDACTED",
    "parse_version",
    "help_flags",
    "takes",
    "BACKENDS",
]

BACKENDS: tuple[str, ...] = tuple(_KNOWN)
FlagValue = int | float | bool | str


@dataclass(frozen=True)
class FlagSpec:
    """One tunable flag. ``cli`` maps backend → how that server spells it; a backend absent there lacks it."""

    name: str  # tuner's name, snake_case (the key of a recommendation's diff)
    kind: Literal["int", "float", "bool", "choice"]
    cli: Mapping[str, str]  # backend -> flag as typed on the server's command line
    help: str
    minimum: float | None = None  # inclusive
    maximum: float | None = None  # inclusive
    choices: tuple[str, ...] = ()
    # backend -> oldest version whose server accepts the flag (vLLM release; llama.cpp build number)
    min_version: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # backend -> the server's other spellings of the flag (llama.cpp's long forms, vLLM's short ones): an
    # extra_args key in any of them would set the flag a second time on the command line
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


FLAGS: tuple[FlagSpec, ...] = (
    # vLLM
    FlagSpec(
        "max_num_seqs", "int", {"vllm": "--max-num-seqs"}, "most sequences scheduled at once", minimum=1, maximum=4096
    ),
    FlagSpec(
        "gpu_memory_utilization",
        "float",
        {"vllm": "--gpu-memory-utilization"},
        "fraction 0-1 of GPU memory vLLM may use (weights + activations + KV cache)",
        minimum=0.05,
        maximum=0.98,
    ),
    FlagSpec(
        "max_model_len",
        "int",
        {"vllm": "--max-model-len"},
        "longest prompt + output, tokens",
        minimum=128,
        maximum=10_485_760,
    ),
    FlagSpec(
        "kv_cache_dtype",
        "choice",
        {"vllm": "--kv-cache-dtype"},
        "KV cache element type",
        choices=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
        min_version={"vllm": (0, 4, 0)},
    ),
    FlagSpec(
        "max_num_batched_tokens",
        "int",
        {"vllm": "--max-num-batched-tokens"},
        "most tokens in one scheduler step (prefill chunk budget)",
        minimum=64,
        maximum=1_048_576,
    ),
    FlagSpec(
        "enable_chunked_prefill",
        "bool",
        {"vllm": "--enable-chunked-prefill"},
        "split long prefills into chunks mixed with decodes",
        min_version={"vllm": (0, 4, 1)},
    ),
    FlagSpec(
        "enable_prefix_caching",
        "bool",
        {"vllm": "--enable-prefix-caching"},
        "reuse KV blocks of repeated prompt prefixes",
        min_version={"vllm": (0, 4, 0)},
    ),
    FlagSpec(
        "tensor_parallel_size",
        "int",
        {"vllm": "--tensor-parallel-size"},
        "GPUs the model is split over",
        minimum=1,
        maximum=64,
        aliases={"vllm": ("-tp",)},
    ),
    FlagSpec(
        "quantization",
        "choice",
        {"vllm": "--quantization"},
        "weight quantization method",
        choices=("awq", "gptq", "fp8", "bitsandbytes"),
        aliases={"vllm": ("-q",)},
    ),
    # llama-server
    FlagSpec(
        "ctx_size",
        "int",
        {"llamacpp": "-c"},
        "total context, tokens, split evenly across --parallel slots",
        minimum=128,
        maximum=10_485_760,
        aliases={"llamacpp": ("--ctx-size",)},
    ),
    FlagSpec(
        "n_gpu_layers",
        "int",
        {"llamacpp": "-ngl"},
        "layers offloaded to the GPU",
        minimum=0,
        maximum=999,
        aliases={"llamacpp": ("--gpu-layers", "--n-gpu-layers")},
    ),
    FlagSpec(
        "batch_size",
        "int",
        {"llamacpp": "-b"},
        "logical batch, tokens",
        minimum=32,
        maximum=65536,
        aliases={"llamacpp": ("--batch-size",)},
    ),
    FlagSpec(
        "ubatch_size",
        "int",
        {"llamacpp": "-ub"},
        "physical batch, tokens (<= -b)",
        minimum=32,
        maximum=65536,
        aliases={"llamacpp": ("--ubatch-size",)},
    ),
    FlagSpec(
        "parallel",
        "int",
        {"llamacpp": "--parallel"},
        "slots decoding at once",
        minimum=1,
        maximum=256,
        aliases={"llamacpp": ("-np",)},
    ),
    # The on|off|auto value form replaced the bare switch in mid-2025 builds.
    FlagSpec(
        "flash_attn",
        "choice",
        {"llamacpp": "-fa"},
        "flash attention",
        choices=("on", "off", "auto"),
        min_version={"llamacpp": (6250,)},
        aliases={"llamacpp": ("--flash-attn",)},
    ),
    # Not a server flag: which server to run at all (the seed's backend choice).
    FlagSpec(
        "backend",
        "choice",
        {"vllm": "backend", "llamacpp": "backend"},
        "which inference server to run",
        choices=BACKENDS,
    ),
)
_BY_NAME = {f.name: f for f in FLAGS}
_BY_CLI = {(b, cli): f for f in FLAGS for b, cli in f.cli.items()}


def _spelling(key: str) -> str:
    """A flag as written anywhere, reduced to compare: no leading dashes, '_' as '-' (vLLM's parser takes both)."""
    return key.lstrip("-").replace("_", "-").lower()


# (backend, a spelling reduced) -> the tunable flag it sets, in every spelling the server takes (its --no- form
# too for a switch); tuner's own name counts as one
_SETS: dict[tuple[str, str], FlagSpec] = {
    (b, pre + _spelling(sp)): f
    for f in FLAGS
    if f.name != "backend"
    for b, cli in f.cli.items()
    for sp in (cli, f.name, *f.aliases.get(b, ()))
    for pre in (("", "no-") if f.kind == "bool" else ("",))
}


# A flag whose value is a credential (vLLM's and llama-server's --api-key, --hf-token, ...): its value is never shown
_SECRET = re.compile(r"key|token|secret|passw|auth|credential")
# Such a flag and its value inside a JSON argv (a journal step, a log line): "--api-key", "VALUE"
_SECRET_IN_JSON = re.compile(
    r'("--?[A-Za-z0-9_-]*(?:key|token|secret|passw|auth|credential)[A-Za-z0-9_-]*",\s*)'
    r'"(?:[^"\\]|\\.)*"',
    re.IGNORECASE,
)
REDACTED = "***"


def secret_flag(key: str) -> bool:
    """Whether the flag ``key`` (any spelling) carries a credential, so its value is never shown."""
    return _SECRET.search(_spelling(key)) is not None


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` to show: the value after each secret flag (secret_flag) replaced by ***."""
    out: list[str] = []
    hide = False
    for arg in argv:
        if hide and not arg.startswith("-"):
            out.append(REDACTED)
        else:
            out.append(arg)
        hide = arg.startswith("-") and secret_flag(arg)
    return out


def redact_argv_text(text: str) -> str:
    """Text holding a JSON argv (a journal step, a log line), the value after each secret flag replaced by ***."""
    return _SECRET_IN_JSON.sub(r'\1"***"', text)


def tunable_spelled(backend: str, key: str) -> FlagSpec | None:
    """The tunable flag that ``key`` (a managed.extra_args key: ``--ctx-size``, ``np``, ``max_num_seqs``) sets on
    ``backend``'s command line, in any of the server's spellings; None for a flag tuner never changes."""
    return _SETS.get((backend, _spelling(key)))


def spec(backend: str, name: str) -> FlagSpec:
    """The spec of ``name`` (tuner's name or the backend's spelling); FlagError when it is not allowed."""
    if backend not in BACKENDS:
        raise FlagError(backend, name, f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    found = _BY_NAME.get(name) or _BY_CLI.get((backend, name))
    if found is None or backend not in found.cli:
        allowed = ", ".join(f.name for f in FLAGS if backend in f.cli)
        raise FlagError(backend, name, f"not on tuner's allow-list for {backend}; allowed: {allowed}")
    return found


def takes(backend: str, name: str) -> bool:
    """Whether ``backend`` has the flag ``name`` (tuner's name) at all."""
    found = _BY_NAME.get(name)
    return found is not None and backend in found.cli


def validate(backend: str, name: str, value: object) -> FlagValue:
    """The value as its declared type, or FlagError naming the flag, the value and what is accepted."""
    s = spec(backend, name)
    if isinstance(value, str) and value.startswith("-"):
        raise FlagError(backend, s.name, f"value {value!r} starts with '-' and would read as another option")
    if s.kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise FlagError(backend, s.name, f"expected true or false, got {value!r}")
    if s.kind == "choice":
        if not isinstance(value, str) or value not in s.choices:
            raise FlagError(backend, s.name, f"expected one of {', '.join(s.choices)}, got {value!r}")
        return value
    number = _number(backend, s, value)
    if s.minimum is not None and number < s.minimum or s.maximum is not None and number > s.maximum:
        raise FlagError(backend, s.name, f"{number!r} is outside {_fmt(s.minimum)}..{_fmt(s.maximum)}")
    return number


def _number(backend: str, s: FlagSpec, value: object) -> int | float:
    if isinstance(value, bool):
        raise FlagError(backend, s.name, f"expected a number, got {value!r}")
    try:
        number = float(value) if s.kind == "float" else _int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise FlagError(
            backend, s.name, f"expected {'a number' if s.kind == 'float' else 'a whole number'}, got {value!r}"
        ) from None
    if not math.isfinite(number):
        raise FlagError(backend, s.name, f"expected a finite number, got {value!r}")
    return number


def _int(value: object) -> int:
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(value)
        return int(value)
    if isinstance(value, (int, str)):
        return int(value)
    raise TypeError(value)


def _fmt(bound: float | None) -> str:
    return "" if bound is None else f"{bound:g}"


def cli_name(backend: str, name: str) -> str:
    return spec(backend, name).cli[backend]


def render(backend: str, diff: Mapping[str, object]) -> dict[str, FlagValue]:
    """A validated diff as the argv builders' flag map: vLLM keys bare ("max-num-seqs"), llama keys dashed."""
    out: dict[str, FlagValue] = {}
    for name, value in diff.items():
        if name == "backend":
            continue
        cli = cli_name(backend, name)
        out[cli if backend_of(backend).dashed_flags else cli.removeprefix("--")] = validate(backend, name, value)
    return out


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """``"0.32.0"`` → (0, 32, 0); llama.cpp ``"b6250-abc"`` / ``"6250"`` → (6250,); a source build "b1" → None."""
    if not text:
        return None
    build = re.match(r"^b?(\d+)(?:-|$)", text.strip())
    if build and "." not in text:
        number = int(build.group(1))
        return (number,) if number > 1 else None  # builds without git history all say "b1"
    release = re.match(r"^v?(\d+(?:\.\d+)*)", text.strip())
    return tuple(int(p) for p in release.group(1).split(".")) if release else None


_HELP_FLAG = re.compile(r"(?:^|[\s,])(--?[A-Za-z][A-Za-z0-9-]*)")


def help_flags(help_text: str) -> frozenset[str]:
    """Every option spelling a server's ``--help`` lists (``-fa``, ``--flash-attn``, ``--max-num-seqs`` …)."""
    return frozenset(_HELP_FLAG.findall(help_text))


def supported(
    backend: str, name: str, version: tuple[int, ...] | None, help_options: frozenset[str] | None
) -> tuple[bool, str]:
    """Whether the running server takes the flag, and why: its ``--help`` decides when known, else its version.

    A flag with a minimum version on a server whose version is unknown counts as unsupported: never guess.
    """
    s = spec(backend, name)
    if name == "backend":
        return True, "not a server flag"
    cli = s.cli[backend]
    if help_options is not None:
        if cli in help_options:
            return True, f"{cli} is listed by the server's --help"
        return False, f"{cli} is not listed by the server's --help"
    need = s.min_version.get(backend)
    if need is None:
        return True, f"{cli} has been accepted by every {backend} release tuner supports"
    shown = backend_of(backend).version_text(need)
    if version is None:
        return False, f"{cli} needs {backend} {shown} or newer and the server's version is unknown"
    if version < need:
        have = backend_of(backend).version_text(version)
        return False, f"{cli} needs {backend} {shown} or newer; the server is {have}"
    return True, f"{cli} is accepted since {backend} {shown}"
