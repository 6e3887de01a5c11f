"""Builds the two optional C extensions: ``edbatch.api._fastrec`` (the recorder's per-node hot
path) and ``edbatch.memory._fastplan`` (the planner's per-read Operand builder); everything
else is in pyproject.toml. ``optional=True``: without a C compiler the install goes on and the
API records through its Python functions (``edbatch.api._fast``), the planner builds its
Operands in Python (``edbatch.memory._operands``). After editing a C file:
``python setup.py build_ext --inplace`` (or reinstall)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("edbatch.api._fastrec", ["edbatch/api/_fastrec.c"],
                             depends=["edbatch/api/_fastrec_opcall.h",
                                      "edbatch/api/_fastrec_methods.h",
                                      "edbatch/api/_fastrec_map.h",
                                      "edbatch/api/_fastrec_route.h", "edbatch/_cslots.h"],
                             optional=True),
                   Extension("edbatch.memory._fastplan", ["edbatch/memory/_fastplan.c"],
                             depends=["edbatch/_cslots.h"], optional=True)])
