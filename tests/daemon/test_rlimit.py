"""The daemon raises its soft limit on open files to the hard one (it keeps one connection per target)."""

from __future__ import annotations

import subprocess
import sys

import pytest

resource = pytest.importorskip("resource")  # POSIX only


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_the_soft_limit_is_raised_to_the_hard_one_and_a_limit_too_low_is_said():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 512:
        pytest.skip(f"this machine's hard limit on open files is {hard}")
    # In a child process: it starts with a soft limit of 256, as a user's shell might give it.
    out = _run(
        "import resource\n"
        "from tuner.daemon.rlimit import raise_open_files\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "limit, warning = raise_open_files(1000)\n"
        "print(limit, resource.getrlimit(resource.RLIMIT_NOFILE)[0], repr(warning))\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))\n"
        "limit, warning = raise_open_files(1000)\n"
        "print(limit, repr(warning))\n"
    )
    first, second = out.splitlines()
    limit, now, warning = first.split(" ", 2)
    want = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    assert int(limit) == int(now) == want and warning == "''"
    limit, warning = second.split(" ", 1)
    assert int(limit) == 300 and "1000 targets need about 1064 open files" in warning and "300" in warning
