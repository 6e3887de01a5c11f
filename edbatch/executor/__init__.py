"""Graph execution: the kernel registry, cell kinds, parameters and the reference executor.

Importing this package registers every kernel: primitive kinds are functions in
:mod:`~edbatch.executor.kernels`; a cell kind is a
:class:`~edbatch.executor.cell_kind.CellKind` subclass, registered when it is defined. The
cell kinds of a workload live in one ``cells_<name>.py`` module of this package
(:mod:`~edbatch.executor.cells_trees`, :mod:`~edbatch.executor.cells_seq`,
:mod:`~edbatch.executor.cells_ggnn`, ...): every such module is found and imported here, so a
new workload's kinds need no line in this file.
"""

from __future__ import annotations

import importlib
import pkgutil

from edbatch.errors import ExecutionError
from edbatch.executor.cell_kind import CellKind, Hoist, Param
from edbatch.executor.kernels import KERNELS, Kernel, kernel_for
from edbatch.executor.params import init_params
from edbatch.executor.reference import reference_loss, run_reference

__all__ = ["KERNELS", "CellKind", "ExecutionError", "Hoist", "Kernel", "Param", "RunResult",
           "TorchExecutor", "execute", "init_params", "kernel_for", "reference_loss",
           "run_reference"]

for _module in pkgutil.iter_modules(__path__):  # the cell kinds, one module per workload
    if _module.name.startswith("cells_"):
        importlib.import_module(f"{__name__}.{_module.name}")

# Last: the batched executor imports the memory planner, which imports the kernels above.
from edbatch.executor.torch_executor import RunResult, TorchExecutor, execute  # noqa: E402
