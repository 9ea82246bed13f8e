"""Open files: the daemon keeps each target's connection alive between scrapes (collect/http.Peers), so 1,000
targets hold 1,000 sockets, beside SQLite's files and the listener. Many systems start a process with a soft
limit of 1,024 open files under a much higher hard one; like Go's runtime does for Prometheus, the daemon raises
its soft limit to the hard one at start. Where even that is too low it says so (a scrape past the limit fails
with its error recorded, "Too many open files", and the others go on)."""

from __future__ import annotations

import resource

__all__ = ["raise_open_files", "NEEDED_BESIDE_TARGETS"]

NEEDED_BESIDE_TARGETS = 64  # SQLite (database, WAL, shm, per connection), the listener, logs, GPU, Alertmanagers
_CAP = 1 << 20  # an unlimited hard limit: ask for this many


def raise_open_files(targets: int) -> tuple[int, str]:
    """Raise the soft limit on open files to the hard one; (the limit now, a warning or "")."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = _CAP if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):  # a container that forbids it: keep what we have
            pass
    needed = targets + NEEDED_BESIDE_TARGETS
    if soft != resource.RLIM_INFINITY and soft < needed:
        return soft, (
            f"{targets} targets need about {needed} open files and this process may open {soft} "
            f"(ulimit -n; hard limit {hard}): scrapes past it fail with 'Too many open files'"
        )
    return soft, ""
