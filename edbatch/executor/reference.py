"""The reference executor: every node alone, in node-id order, with the registered kernels.

It is the oracle of the equivalence tests: a batched executor must give the same outputs
(up to float rounding), because it runs the same kernels on batches whose rows are exactly
these batch-of-one calls. Values are kept in a dict and dropped after their last user, as
``torch.fx.Interpreter`` does; the graph's outputs are kept and returned.

Example:
    >>> import torch
    >>> from edbatch.workloads.tree_gru import TreeGRU
    >>> from edbatch.executor import init_params
    >>> wl = TreeGRU(embed_dim=4, hidden_dim=4)
    >>> graph = wl.minibatch("dev", [0, 1])
    >>> loss = reference_loss(graph, init_params(wl, torch.Generator().manual_seed(0)))
    >>> loss.shape, bool(loss > 0)
    (torch.Size([]), True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from edbatch.errors import ExecutionError, GraphError
from edbatch.executor.kernels import Kernel, kernel_for
from edbatch.graph import Graph, OpType

__all__ = ["free_schedule", "reference_loss", "run_reference"]


def free_schedule(graph: Graph) -> list[list[int]]:
    """For each node ``v``, the values that can be dropped once ``v`` has run.

    A value is dropped after its last user; a value nobody uses right after it is made.
    Graph outputs are never dropped.
    """
    n = graph.num_nodes
    last = np.arange(n, dtype=np.int64)  # unused values die at once
    if graph.num_edges:
        consumer = np.repeat(np.arange(n, dtype=np.int64), graph.arity)
        np.maximum.at(last, graph.operand_ids.astype(np.int64), consumer)
    keep = set(graph.outputs.tolist())
    frees: list[list[int]] = [[] for _ in range(n)]
    for u, v in enumerate(last.tolist()):
        if u not in keep:
            frees[v].append(u)
    return frees


def _params_device(params: Mapping[str, Tensor]) -> torch.device:
    for p in params.values():
        return p.device
    return torch.device("cpu")


def _failure(graph: Graph, v: int, op: OpType, inputs: Sequence[Tensor], problem: str
             ) -> ExecutionError:
    shapes = ", ".join(str(tuple(x.shape)) for x in inputs) or "none"
    return ExecutionError(
        f"reference execution failed at node {graph.node(v)} (op type {op.name!r}, kind "
        f"{op.kind!r}, instance {int(graph.instance[v])}, operand shapes {shapes}): {problem}")


def run_reference(graph: Graph, params: Mapping[str, Tensor], *,
                  device: str | torch.device | None = None,
                  kernels: Mapping[str, Kernel] | None = None) -> dict[int, Tensor]:
    """Run every node of ``graph`` alone (a batch of one), in node-id order.

    Args:
        graph: the graph; every op kind it uses needs a registered kernel.
        params: parameter name -> tensor (e.g. from :func:`~edbatch.executor.init_params`).
        device: where to run; parameters are moved there (differentiably). Defaults to the
            parameters' device (CPU when there are none).
        kernels: op kind -> kernel, overriding the registered kernels for those kinds (as
            :class:`~edbatch.executor.torch_executor.TorchExecutor` takes them).

    Returns:
        ``{output node id: value [1, prod(out_shape)]}`` for every graph output.

    Raises:
        UnknownNameError: an op kind of the graph has no kernel (e.g. an ED-Batch dump).
        ExecutionError: a kernel raised, or returned a wrongly shaped value; the message
            names the node, its op type and the original exception (chained as the cause).
    """
    dev = torch.device(device) if device is not None else _params_device(params)
    if device is not None:
        params = {name: p.to(dev) for name, p in params.items()}
    vocab = graph.vocab
    used = np.flatnonzero(graph.type_counts).tolist()
    by_op: dict[int, Kernel] = {k: kernel_for(vocab[k], kernels) for k in used}
    attrs = torch.from_numpy(graph.attrs.copy()).to(dev)
    ptr, ids = graph.operand_ptr.tolist(), graph.operand_ids.tolist()
    frees = free_schedule(graph)
    values: dict[int, Tensor] = {}
    for v, k in enumerate(graph.op_ids.tolist()):
        op: OpType = vocab[k]
        inputs = [values[u] for u in ids[ptr[v]:ptr[v + 1]]]
        try:
            out = by_op[k](op, inputs, params, attrs[v:v + 1])
        except Exception as e:
            raise _failure(graph, v, op, inputs, f"{type(e).__name__}: {e}") from e
        width = math.prod(op.out_shape)
        if tuple(out.shape) != (1, width):
            raise _failure(graph, v, op, inputs, f"kernel {op.kind!r} returned shape "
                           f"{tuple(out.shape)}, expected (1, {width}); fix the kernel")
        values[v] = out
        for u in frees[v]:
            del values[u]
    return {int(o): values[int(o)] for o in graph.outputs}


def reference_loss(graph: Graph, params: Mapping[str, Tensor], *,
                   device: str | torch.device | None = None) -> Tensor:
    """The single output of a mini-batch graph (its ``loss_sum`` node) as a scalar.

    Raises:
        GraphError: the graph does not have exactly one output of one value; build it with
            ``Workload.minibatch`` / ``build_graph`` and ``loss_sum=True``.
    """
    if len(graph.outputs) != 1:
        raise GraphError(f"reference_loss needs a graph with exactly one output (the "
                         f"loss_sum node), got {len(graph.outputs)}; build the mini-batch "
                         f"with loss_sum=True")
    (value,) = run_reference(graph, params, device=device).values()
    if value.numel() != 1:
        raise GraphError(f"the output of the graph has {value.numel()} values, expected one "
                         f"loss; make the loss_sum node the graph's only output")
    return value.reshape(())
