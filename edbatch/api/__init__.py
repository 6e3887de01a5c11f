"""The user API: register ``torch.nn.Module`` cells, write per-instance code, run it batched.

A :class:`DynamicBatch` records the dataflow graph of one mini-batch while ordinary Python
code (tree recursion, loops over lattices) calls registered cells on :class:`Handle` s. Its
:meth:`~DynamicBatch.run` schedules the graph with any scheduler or policy, plans memory and
executes it with :class:`~edbatch.executor.torch_executor.TorchExecutor`: one call of each
module per batch, on all the rows of that batch. Modules must treat rows independently (as
``nn.Linear`` does); their own parameters are used, so gradients reach them as usual.

Every registered cell is an op type of kind ``user.<name>`` whose kernel (in the batch's own
kernel table, passed to the executor) calls the module. A DynamicBatch is long-lived (like a
model); each :meth:`~DynamicBatch.run` ends one mini-batch and starts the next one. The
first run of a process loads the compiled scheduling core (about 0.3 s): call
:func:`warmup` at start-up to pay it there.

Example:
    >>> import torch
    >>> from torch import nn
    >>> _ = torch.manual_seed(0)
    >>> batch = DynamicBatch()
    >>> embed = nn.Embedding(10, 4)
    >>> cell = batch.cell(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), "step", [4], 4)
    >>> loss = batch.cell(lambda h: h.pow(2).sum(1), "sq", [4], ())
    >>> for words in ([1, 2, 3], [4, 5]):
    ...     with batch.instance():
    ...         h = batch.lookup(embed, words[0])
    ...         for w in words[1:]:
    ...             h = cell(h)
    ...         batch.add_loss(loss(h))
    >>> out = batch.run("typewise_greedy")
    >>> out.loss.shape, out.num_batches
    (torch.Size([]), 5)
"""

from edbatch.api._assemble import RecordingWarning, take_graph
from edbatch.api._batch import DynamicBatch
from edbatch.api._builtins import BuiltinOp
from edbatch.api._bulk import Handles, switch
from edbatch.api._handles import Cell, Handle, ShapeLike
from edbatch.api._programs import ProgramsResult
from edbatch.api._requests import ArgMax, TopK, argmax, topk
from edbatch.api._result import BatchResult
from edbatch.api._route import route
from edbatch.api._schedulers import AutoScheduler, SchedulerLike, memory_strategy
from edbatch.api._variadic import VariadicCell, segment_sum
from edbatch.api._warmup import warmup

__all__ = ["AutoScheduler", "BatchResult", "BuiltinOp", "Cell", "DynamicBatch", "Handle", "Handles",
           "ArgMax", "ProgramsResult", "RecordingWarning", "SchedulerLike", "ShapeLike",
           "TopK", "VariadicCell", "argmax", "memory_strategy", "route", "segment_sum", "switch",
           "take_graph", "topk", "warmup"]
