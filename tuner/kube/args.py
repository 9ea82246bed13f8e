"""A container's args and the flags tuner may change in them: read them, set some of them in place.

Only the spellings on the allow-list (tuner/flags.py) are tuner's; every other arg is left as it is, in its place.
A flag is read as ``--name value``, ``--name=value``, a bare ``--name`` (a bool: true) or ``--no-name`` (false).
Setting one rewrites each of its occurrences in place, keeping the ``=`` form where it was used; a flag the args
lack is appended. The new spellings come rendered by the caller (the argv builders' rules), never built here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tuner.errors import FlagError
from tuner.flags import FLAGS, FlagSpec, validate

__all__ = ["Occurrence", "occurrences", "parse_flags", "rewrite_args", "tunable_in"]


class Occurrence:
    """One tunable flag in the args: ``start`` and ``end`` (exclusive) index the tokens it spans."""

    __slots__ = ("spec", "start", "end", "value", "equals")

    def __init__(self, spec: FlagSpec, start: int, end: int, value: Any, equals: bool) -> None:
        self.spec, self.start, self.end, self.value, self.equals = spec, start, end, value, equals


def _specs(backend: str) -> tuple[dict[str, FlagSpec], dict[str, FlagSpec]]:
    """(spelling -> spec, "--no-" spelling -> spec of a bool) for the backend's server flags."""
    on = {f.cli[backend]: f for f in FLAGS if backend in f.cli and f.name != "backend"}
    off = {"--no-" + cli[2:]: f for cli, f in on.items() if f.kind == "bool" and cli.startswith("--")}
    return on, off


def occurrences(backend: str, args: Sequence[str]) -> list[Occurrence]:
    """Every tunable flag in ``args``, in order; FlagError when one that takes a value ends the args."""
    on, off = _specs(backend)
    out: list[Occurrence] = []
    i = 0
    while i < len(args):
        token = args[i]
        name, eq, text = token.partition("=") if token.startswith("--") else (token, "", "")
        if name in off and not eq:
            out.append(Occurrence(off[name], i, i + 1, False, False))
        elif name in on:
            s = on[name]
            if s.kind == "bool" and not eq:
                out.append(Occurrence(s, i, i + 1, True, False))
            elif eq:
                out.append(Occurrence(s, i, i + 1, text, True))
            elif i + 1 < len(args):
                out.append(Occurrence(s, i, i + 2, args[i + 1], False))
                i += 1
            else:
                raise FlagError(backend, s.name, f"the container's args end with {name} and no value")
        i += 1
    return out


def parse_flags(backend: str, args: Sequence[str]) -> dict[str, Any]:
    """The allow-listed flags the args set, by tuner's names, validated (the last occurrence wins, as in argparse);
    FlagError naming the flag whose value is not valid."""
    return {o.spec.name: validate(backend, o.spec.name, o.value) for o in occurrences(backend, args)}


def tunable_in(backend: str, args: Sequence[str]) -> list[str]:
    """The spellings of tunable flags present in ``args`` (e.g. in a container's command, where tuner patches
    nothing)."""
    return [args[o.start].partition("=")[0] for o in occurrences(backend, args)]


def rewrite_args(backend: str, args: Sequence[str], rendered: Mapping[str, list[str]]) -> list[str]:
    """``args`` with each flag of ``rendered`` (tuner's name -> its argv elements, e.g. ["--max-num-seqs", "8"],
    ["--enable-prefix-caching"] or ["--no-enable-prefix-caching"]) set: every occurrence in place, a missing one
    appended; every other arg untouched and in order."""
    found = occurrences(backend, args)
    out: list[str] = []
    pos = 0
    for o in found:
        out += args[pos : o.start]
        new = rendered.get(o.spec.name)
        if new is None:
            out += args[o.start : o.end]
        elif o.equals and len(new) == 2:
            out.append(f"{new[0]}={new[1]}")
        else:
            out += new
        pos = o.end
    out += args[pos:]
    present = {o.spec.name for o in found}
    for name, new in rendered.items():
        if name not in present:
            out += new
    return out
