"""The one compiled part, optional: the layout fast path's split (tuner/collect/_numbers.c).

Everything else is in pyproject.toml. Without a C compiler the build goes on without it (``optional=True``) and
collect/layout.py splits with a regex instead; TUNER_PURE_PYTHON=1 chooses the regex even where it was built.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tuner.collect._numbers", ["tuner/collect/_numbers.c"], optional=True,
                             extra_compile_args=["-O2"])])
