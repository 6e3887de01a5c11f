"""Graph execution: the kernel registry, cell kinds, parameters and the reference executor.

Importing this package registers every kernel: primitive kinds are functions in
:mod:`~edbatch.executor.kernels`; a cell kind is a
:class:`~edbatch.executor.cell_kind.CellKind` subclass, registered when it is defined (the
built-in ones in :mod:`~edbatch.executor.cells`, :mod:`~edbatch.executor.cells_trees` and
:mod:`~edbatch.executor.cells_seq`).
"""

from __future__ import annotations

from edbatch.errors import ExecutionError
from edbatch.executor import cells_seq, cells_trees  # noqa: F401  (the built-in cell kinds)
from edbatch.executor import cells_sick as _cells_sick  # noqa: F401  (SICK Tree-LSTM kernels)
from edbatch.executor.cell_kind import CellKind, Hoist, Param
from edbatch.executor.kernels import KERNELS, Kernel, kernel_for
from edbatch.executor.params import init_params
from edbatch.executor.reference import reference_loss, run_reference

__all__ = ["KERNELS", "CellKind", "ExecutionError", "Hoist", "Kernel", "Param", "RunResult",
           "TorchExecutor", "execute", "init_params", "kernel_for", "reference_loss",
           "run_reference"]

# Last: the batched executor imports the memory planner, which imports the kernels above.
from edbatch.executor import cells_ggnn  # noqa: F401  (GGNN molecule kernels)
from edbatch.executor.torch_executor import RunResult, TorchExecutor, execute
