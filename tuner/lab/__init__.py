"""Lab tools for putting real servers under known, bounded load (fixtures, integration tests, the demo)."""

from tuner.lab.load import LoadResult, make_prompt, run_load

__all__ = ["LoadResult", "make_prompt", "run_load"]
