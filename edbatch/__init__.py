"""edbatch: learned batching of dynamic neural networks."""

# first: deletes numba caches that predate a change of the compiled sources (its doc says why)
from edbatch import _numba_cache  # noqa: F401
from edbatch.errors import (
    DataFormatError,
    EdbatchError,
    GraphError,
    InvalidActionError,
    ScheduleError,
    UnknownNameError,
)
from edbatch.graph import Graph, GraphBuilder, OpType, Vocab, merge_graphs

__version__ = "0.1.0"

__all__ = [
    "DataFormatError",
    "EdbatchError",
    "Graph",
    "GraphBuilder",
    "GraphError",
    "InvalidActionError",
    "OpType",
    "ScheduleError",
    "UnknownNameError",
    "Vocab",
    "__version__",
    "merge_graphs",
]
