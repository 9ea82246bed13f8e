"""tuner's one compiled module (collect/_numbers.c), where it was built.

``pip install`` builds it when there is a C compiler (setup.py: an optional extension). Without it, or with
TUNER_PURE_PYTHON=1, ``compiled`` answers None and its callers (collect/layout.py, store/counts.py) do the same
work in Python.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["compiled"]


def compiled(name: str) -> Callable[..., Any] | None:
    """The compiled module's function ``name``, or None where Python does the work."""
    if os.environ.get("TUNER_PURE_PYTHON"):
        return None
    try:
        from tuner.collect import _numbers  # type: ignore[attr-defined]
    except ImportError:  # built without a C compiler
        return None
    function: Callable[..., Any] = getattr(_numbers, name)
    return function
