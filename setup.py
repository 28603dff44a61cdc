"""Only the optional compiled cores live here (everything else is in pyproject.toml).

``optional=True``: without a C compiler the build skips an extension and the package runs the
Python code instead (``timeline --version`` says which cores are active): the allocator model
(``timeline.alloc._ccore``) and the writers of snapshot.pickle (``timeline.exporters._cpickle``)
and trace.json (``timeline.exporters._ctext``).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("timeline.alloc._ccore", ["timeline/alloc/_ccore.c"], optional=True,
                             extra_compile_args=["-O2"]),
                   *(Extension(f"timeline.exporters._{name}", [f"timeline/exporters/_{name}.c"], optional=True,
                               depends=["timeline/exporters/_cbuffer.h"], extra_compile_args=["-O2"])
                     for name in ("cpickle", "ctext"))])
