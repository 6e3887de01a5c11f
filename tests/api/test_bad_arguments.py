"""``edbatch.api`` arguments of the wrong kind are ``GraphError`` / ``UnknownNameError``
naming the value and the fix, where they are passed: a cell name or ``in_shapes`` of the
wrong type, a lookup index that is no integer (``1.5`` was cut to row 1, ``True`` read as
row 1), a row that is no tensor (a NumPy row was recorded, then broke ``run`` with a raw
``TypeError``), ``run(params=...)`` entries that are no tensors, a policy file's path
passed to ``run`` as if it were a scheduler name."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from edbatch.api import DynamicBatch
from edbatch.errors import GraphError, UnknownNameError

__all__: list[str] = []


class Add(nn.Module):
    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return a + b


class Total(nn.Module):
    def forward(self, h: Tensor) -> Tensor:
        return h.sum(1)


@pytest.mark.parametrize("name, in_shapes, match", [
    (5, [4, 4], "cell name 5 must be a non-empty str"),
    ("add", None, "in_shapes must be a list with one shape .* got None"),
    ("add", 4, "in_shapes must be a list with one shape .* got 4"),
    ("add", [4.5, 4], r"in_shapes\[0\] must be an int or a tuple of positive ints, got 4.5"),
    ("add", [True, 4], r"in_shapes\[0\] must be an int .* got True"),
])
def test_bad_cell_arguments(name: Any, in_shapes: Any, match: str) -> None:
    with pytest.raises(GraphError, match=match):
        DynamicBatch().cell(Add(), name, in_shapes, 4)


@pytest.mark.parametrize("index", [1.5, 1.0, True, "1", None, torch.tensor(1.0),
                                   torch.tensor([1, 2])])
def test_a_lookup_index_must_be_an_integer(index: Any) -> None:
    batch, emb = DynamicBatch(), nn.Embedding(5, 3)
    batch.lookup(emb, 0)  # registered: the same checks on the fast path's fallback
    with pytest.raises(GraphError, match=r"cell 'embedding0': lookup index .* is not an "
                                         r"integer row number"):
        batch.lookup(emb, index)


def test_integer_lookup_indices_of_every_kind_read_the_same_row() -> None:
    batch, emb = DynamicBatch(), nn.Embedding(5, 3)
    total = batch.cell(Total(), "total", [3], ())
    for index in (2, np.int64(2), torch.tensor(2)):
        with batch.instance():
            batch.add_loss(total(batch.lookup(emb, index)))
    loss = batch.run().loss
    assert loss is not None
    torch.testing.assert_close(loss, 3 * emb.weight[2].sum())


@pytest.mark.parametrize("row", [np.zeros(4), [0.0] * 4, 1.0])
def test_a_row_that_is_no_tensor_is_refused_and_the_batch_still_runs(row: Any) -> None:
    batch = DynamicBatch()
    total = batch.cell(Total(), "total", [4], ())
    with batch.instance():
        with pytest.raises(GraphError, match=r"batch.input\(row\) takes a torch.Tensor, got "):
            batch.input(row)
        with pytest.raises(GraphError, match=r"batch.inputs\(rows\) takes a torch.Tensor"):
            batch.inputs(row)
        batch.add_loss(total(batch.input(torch.ones(4))))
    loss = batch.run().loss
    assert loss is not None and float(loss) == 4.0


@pytest.mark.parametrize("params, match", [
    ({"x": 1}, r"entry 'x' -> int; expected a str name -> torch.Tensor"),
    ({1: torch.ones(1)}, r"entry 1 -> Tensor"),
    ([torch.ones(1)], r"takes a dict of name -> torch.Tensor, got list"),
])
def test_run_params_must_map_names_to_tensors(params: Any, match: str) -> None:
    batch = DynamicBatch()
    total = batch.cell(Total(), "total", [4], ())
    with batch.instance():
        batch.add_loss(total(batch.input(torch.ones(4))))
    with pytest.raises(GraphError, match=match):
        batch.run(params=params)
    loss = batch.run().loss  # the recording is kept: fixed, it runs
    assert loss is not None and float(loss) == 4.0


@pytest.mark.parametrize("path", ["runs/own_model/policy.json", "policy.json"])
def test_a_policy_path_passed_as_a_scheduler_name_says_load_policy(path: str) -> None:
    batch = DynamicBatch()
    total = batch.cell(Total(), "total", [4], ())
    with batch.instance():
        batch.add_loss(total(batch.input(torch.ones(4))))
    with pytest.raises(UnknownNameError, match=r"looks like a file; to run a saved policy "
                                               r"pass policies.load_policy"):
        batch.run(path)


@pytest.mark.parametrize("attr", [1.5, True, "3", np.float64(2.0), [1]])
def test_a_user_cell_attr_must_be_an_integer(attr: Any) -> None:
    """(``int()`` cut 1.5 to 1 and read ``True`` as 1; ``"x"`` was a raw ``ValueError``.)"""
    batch = DynamicBatch()
    scale = batch.cell(lambda x, a: x * a[:, None], "scale", [3], 3, takes_attr=True)
    h = batch.input(torch.ones(3))
    scale(h, attr=np.int64(2))  # numpy integers are integers
    with pytest.raises(GraphError, match=rf"cell 'scale': attr={re.escape(repr(attr))} .* is "
                                         rf"no integer"):
        scale(h, attr=attr)


def test_run_outputs_and_params_of_the_wrong_kind_name_it() -> None:
    """``outputs=5`` was a raw ``TypeError``; a misspelt ``params=`` name was ignored (the
    built-in tensor ran); ``if handle:`` was always true."""
    batch = DynamicBatch()
    total = batch.cell(Total(), "total", [3], ())
    for outputs, found in ((5, "got int"), ("h", "got str"), (None, "got NoneType")):
        with batch.instance():
            batch.add_loss(total(batch.input(torch.ones(3))))
        with pytest.raises(GraphError, match=rf"run\(outputs=...\) takes a list of handles, "
                                             rf"{found}"):
            batch.run("depth", outputs=outputs)
        batch.discard()
    with batch.instance():
        h = batch.input(torch.ones(3))
        batch.add_loss(total(h))
    with pytest.raises(GraphError, match="has no value while recording"):
        bool(h)
    with pytest.raises(GraphError, match="one node, not a sequence"):
        batch.run("depth", outputs=h)
    with pytest.raises(GraphError, match=r"'total.w' is no parameter .* \(none here\)"):
        batch.run("depth", params={"total.w": torch.ones(1)})
    batch.discard()


def test_run_params_names_a_misspelt_builtin_parameter() -> None:
    from edbatch.executor import init_params
    from edbatch.workloads import make_workload

    wl = make_workload("tree_lstm", embed_dim=4, hidden_dim=4)
    params = init_params(wl, torch.Generator().manual_seed(0))
    batch = DynamicBatch.from_workload(wl)
    leaf, loss = batch.op("tree_lstm.leaf"), batch.op("tree_lstm.loss")
    name = next(iter(params))
    for given, ok in ((params, True), ({name + "x": params[name]}, False)):
        with batch.instance():
            batch.add_loss(loss(leaf(attr=1), attr=0))
        if ok:
            assert batch.run("depth", params=given).loss is not None
        else:
            with pytest.raises(GraphError, match=rf"{name}x' is no parameter .* Did you mean "
                                                 rf"'{name}'"):
                batch.run("depth", params=given)
            batch.discard()


def test_run_params_of_another_shape_or_dtype_are_refused() -> None:
    """A transposed table was read as rows of the wrong length (a wrong id error, or a
    kernel "returning" the wrong shape), a float64 one torch's dtype clash mid-run."""
    from edbatch.executor import init_params
    from edbatch.workloads import make_workload

    wl = make_workload("tree_lstm", embed_dim=4, hidden_dim=6)
    params = init_params(wl, torch.Generator().manual_seed(0))
    batch = DynamicBatch.from_workload(wl, params)
    leaf, loss = batch.op("tree_lstm.leaf"), batch.op("tree_lstm.loss")
    table = params["tree_lstm.E"]
    rows, width = tuple(table.shape)
    for given, match in (
            (table.t().contiguous(), rf"'tree_lstm.E' has shape \({width}, {rows}\), the "
                                     rf"batch's own \({rows}, {width}\); pass a tensor of that"),
            (table.reshape(-1), r"'tree_lstm.E' has shape \(\d+,\)"),
            (table.double(), r"'tree_lstm.E' is torch.float64, the batch runs in "
                             r"torch.float32 \(DynamicBatch\(dtype=...\)\); pass it as "
                             r"tensor.to\(torch.float32\)"),
            (table.long(), r"is torch.int64, the batch runs in torch.float32")):
        with batch.instance():
            batch.add_loss(loss(leaf(attr=1), attr=0))
        with pytest.raises(GraphError, match=match):
            batch.run("depth", params={"tree_lstm.E": given})
        batch.discard()
    with batch.instance():
        batch.add_loss(loss(leaf(attr=1), attr=0))
    assert batch.run("depth", params={"tree_lstm.E": table * 2}).loss is not None


def test_from_workload_params_of_another_shape_or_dtype_are_refused() -> None:
    """Checked when the batch is made (were a cell kind's shape error or torch's dtype clash
    at the first run)."""
    from edbatch.executor import init_params
    from edbatch.workloads import make_workload

    wl = make_workload("tree_lstm", embed_dim=4, hidden_dim=6)
    params = init_params(wl, torch.Generator().manual_seed(0))
    rows = len(params["tree_lstm.E"])
    for swap, match in (
            (params["tree_lstm.E"].t(), rf"params\['tree_lstm.E'\] has shape \(4, {rows}\), "
                                        rf"the workload's is \({rows}, 4\)"),
            (params["tree_lstm.E"].double(), r"params\['tree_lstm.E'\] is torch.float64, the "
                                             r"batch runs in torch.float32; pass DynamicBatch"
                                             r".from_workload\(..., dtype=torch.float64\)"),
            (params["tree_lstm.E"].tolist(), r"params\['tree_lstm.E'\] is list; pass torch")):
        with pytest.raises(GraphError, match=match):
            DynamicBatch.from_workload(wl, {**params, "tree_lstm.E": swap})
    doubled = {k: v.double() for k, v in params.items()}
    DynamicBatch.from_workload(wl, doubled, dtype=torch.float64)  # its own dtype: fine


def test_a_user_scheduler_must_return_a_valid_schedule() -> None:
    """A ``graph -> Schedule`` callable's result is checked (``None`` was a raw
    ``AttributeError``, a schedule in the wrong order a raw ``IndexError``)."""
    from edbatch.errors import ScheduleError
    from edbatch.schedule import Schedule, make_scheduler

    depth = make_scheduler("depth")
    batch = DynamicBatch()
    step = batch.cell(nn.Linear(3, 3), "step", [3], 3)
    total = batch.cell(Total(), "total", [3], ())

    def record() -> None:
        for n in (1, 2):
            with batch.instance():
                h = batch.input(torch.ones(3))
                for _ in range(n):
                    h = step(h)
                batch.add_loss(total(h))

    for scheduler, error, found in (
            (lambda g: None, GraphError, "returned NoneType; a scheduler returns a Schedule"),
            (lambda g: [[0]], GraphError, "returned list"),
            (lambda g: Schedule(list(depth(g).batches)[::-1], "rev"), ScheduleError,
             "operands must run earlier"),
            (lambda g: Schedule(list(depth(g).batches)[:-1], "cut"), ScheduleError,
             "runs 0 times")):
        record()
        with pytest.raises(error, match=found):
            batch.run(scheduler)
        batch.discard()
    record()
    graph = batch.graph()[0]
    assert batch.run(depth).num_batches == depth(graph).num_batches  # a valid one runs
    from edbatch.api._schedulers import AutoScheduler, as_scheduler

    auto = AutoScheduler()  # edbatch's own are not wrapped (an AutoScheduler keeps its role)
    assert as_scheduler(depth) is depth and as_scheduler(auto) is auto
