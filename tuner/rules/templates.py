"""The part of Prometheus's alert templating that alert annotations use, with Go's number formatting.

Supported: ``{{ $labels.NAME }}``, ``{{ $value }}``, ``{{ $value | humanize }}``,
``| humanizePercentage``, ``| humanizeDuration`` and ``{{ printf "%.2f" $value }}``. Anything else is
rejected when the rule file loads (``check``), so an annotation never renders half-expanded.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

__all__ = ["render", "check", "go_float"]

_ACTION = re.compile(r"{{-?\s*(.*?)\s*-?}}")
_LABEL = re.compile(r"^\$labels\.([A-Za-z_][A-Za-z0-9_]*)\Z")
_PRINTF = re.compile(r'^printf\s+"(%[-+ #0]*\d*(?:\.\d+)?[dfgeGsv])"\s+\$value$')
_PIPE = re.compile(r"^\$value\s*\|\s*(humanize|humanizePercentage|humanizeDuration)\Z")


def go_float(v: float) -> str:
    """Go's %v for a float64 (strconv 'g', shortest): 0.97, 1e+06, 1.234567e+06, NaN, +Inf."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "0"
    d = Decimal(repr(v)).normalize()
    sign, digits, exp = d.as_tuple()
    s = "".join(map(str, digits))
    assert isinstance(exp, int)  # finite: not "n", "N" or "F"
    point = len(s) + exp  # position of the decimal point in the digit string
    e = point - 1
    if e < -4 or e >= 6:  # strconv 'g' with shortest digits decides with precision 6
        mant = s[0] + ("." + s[1:] if len(s) > 1 else "")
        out = f"{mant}e{'+' if e >= 0 else '-'}{abs(e):02d}"
    elif point <= 0:
        out = "0." + "0" * (-point) + s
    elif point >= len(s):
        out = s + "0" * (point - len(s))
    else:
        out = s[:point] + "." + s[point:]
    return ("-" if sign else "") + out


def _g4(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return f"{v:.4g}"


def _humanize(v: float) -> str:
    if v == 0 or math.isnan(v) or math.isinf(v):
        return _g4(v)
    prefix = ""
    if abs(v) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(v) < 1000:
                break
            prefix, v = p, v / 1000
    else:
        for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
            if abs(v) >= 1:
                break
            prefix, v = p, v * 1000
    return _g4(v) + prefix


def _humanize_duration(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return _g4(v)
    if v == 0:
        return _g4(v) + "s"
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        d = int(v)
        s, m, h, days = d % 60, (d // 60) % 60, (d // 3600) % 24, d // 86400
        if days:
            return f"{sign}{days}d {h}h {m}m {s}s"
        if h:
            return f"{sign}{h}h {m}m {s}s"
        if m:
            return f"{sign}{m}m {s}s"
        return f"{sign}{_g4(v)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return f"{_g4(v)}{prefix}s"


_PIPES = {
    "humanize": _humanize,
    "humanizePercentage": lambda v: _g4(v * 100) + "%",
    "humanizeDuration": _humanize_duration,
}


def _action(expr: str, labels: dict[str, str], value: float) -> str:
    if m := _LABEL.match(expr):
        return labels.get(m.group(1), "")
    if expr == "$value":
        return go_float(value)
    if m := _PIPE.match(expr):
        return _PIPES[m.group(1)](value)
    if m := _PRINTF.match(expr):
        return m.group(1) % value if not m.group(1).endswith(("s", "v")) else go_float(value)
    raise ValueError(
        f"unsupported template action {{{{ {expr} }}}} (supported: $labels.NAME, $value, "
        '$value | humanize / humanizePercentage / humanizeDuration, printf "%.2f" $value)'
    )


def check(text: str) -> None:
    """Raise ValueError naming the first unsupported action, or an action opened and never closed (Go's
    text/template refuses ``{{ $value `` as "unclosed action"; rendered, it would show as typed)."""
    for m in _ACTION.finditer(text):
        _action(m.group(1), {}, 0.0)
    rest = _ACTION.sub("", text)
    if (at := rest.find("{{")) >= 0:
        raise ValueError(f"unclosed action {rest[at : at + 30]!r}: close it with }}}} (or drop the {{{{)")


def render(text: str, labels: dict[str, str], value: float) -> str:
    return _ACTION.sub(lambda m: _action(m.group(1), labels, value), text)
