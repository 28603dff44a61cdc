"""Only the optional compiled allocator core lives here (everything else is in pyproject.toml).

``optional=True``: without a C compiler the build skips the extension and the package runs the
Python allocator model (``timeline --version`` says which core is active).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("timeline.alloc._ccore", ["timeline/alloc/_ccore.c"], optional=True,
                             extra_compile_args=["-O2"])])
