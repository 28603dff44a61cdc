"""Only the optional compiled cores live here (everything else is in pyproject.toml).

``optional=True``: without a C compiler the build skips an extension and the package runs the
Python code instead (``timeline --version`` says which cores are active): the allocator model
(``timeline.alloc._ccore``) and the writers of snapshot.pickle and trace.json
(``timeline.exporters._cwrite``).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("timeline.alloc._ccore", ["timeline/alloc/_ccore.c"], optional=True,
                             extra_compile_args=["-O2"]),
                   Extension("timeline.exporters._cwrite", ["timeline/exporters/_cwrite.c"], optional=True,
                             extra_compile_args=["-O2"])])
