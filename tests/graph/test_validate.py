"""The compiled one-pass graph check (``edbatch.graph._scan``) against its numpy oracle:
same depths on valid graphs, and on corrupted arrays it says "bad" exactly when the numpy
checks raise, so ``Graph.from_arrays`` raises the same message either way."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.errors import GraphError
from edbatch.graph import Graph
from edbatch.graph._scan import scan
from edbatch.graph._validate import compute_depth, shape_tables, validate_arrays
from edbatch.workloads import make_workload
from edbatch.workloads.synthetic import random_dag


def _graphs() -> list[Graph]:
    out = [random_dag(np.random.default_rng(s), 1 + 60 * s, 4, 3, 0.1) for s in range(4)]
    for name in ("tree_lstm", "lattice_lstm", "bilstm_tagger"):
        wl = make_workload(name, embed_dim=4, hidden_dim=3)
        out.append(wl.build_graph(wl.load("dev")[:5]))
    return out


GRAPHS = _graphs()


def _arrays(g: Graph) -> dict[str, np.ndarray]:  # type: ignore[type-arg]
    return {"op_ids": g.op_ids.copy(), "ptr": g.operand_ptr.copy(),
            "ids": g.operand_ids.copy(), "outputs": g.outputs.copy()}


def _scan_ok(g: Graph, a: dict[str, np.ndarray]) -> bool:  # type: ignore[type-arg]
    return bool(scan(a["op_ids"], a["ptr"], a["ids"], a["outputs"], *shape_tables(g.vocab))[1])


def _numpy_error(g: Graph, a: dict[str, np.ndarray]) -> str | None:  # type: ignore[type-arg]
    try:
        validate_arrays(g.vocab, a["op_ids"], a["ptr"], a["ids"], g.attrs, g.instance,
                        a["outputs"])
    except GraphError as e:
        return str(e)
    return None


@pytest.mark.parametrize("k", range(len(GRAPHS)))
def test_scan_depth_equals_the_python_depth(k: int) -> None:
    g = GRAPHS[k]
    depth, ok = scan(g.op_ids, g.operand_ptr, g.operand_ids, g.outputs, *shape_tables(g.vocab))
    assert ok and depth.dtype == np.int32
    np.testing.assert_array_equal(depth, compute_depth(g.operand_ptr, g.operand_ids))
    np.testing.assert_array_equal(depth, g.depth)


def _corrupt(rng: np.random.Generator, g: Graph) -> dict[str, np.ndarray]:  # type: ignore[type-arg]
    a = _arrays(g)
    n, e, what = g.num_nodes, g.num_edges, rng.integers(5)
    if what == 0:  # an op id: unknown, or another type (arity or shapes may then differ)
        a["op_ids"][rng.integers(n)] = rng.integers(-1, len(g.vocab) + 1)
    elif what == 1 and e:  # an operand: earlier, later, itself, negative
        a["ids"][rng.integers(e)] = rng.integers(-1, n)
    elif what == 2 and n > 1:  # a row pointer (arity, or a non-monotone CSR)
        a["ptr"][rng.integers(1, n)] += rng.integers(-2, 3)
    elif what == 3 and len(a["outputs"]):
        a["outputs"][rng.integers(len(a["outputs"]))] = rng.integers(-1, n + 1)
    elif e > 1:  # two operands swapped (a shape mismatch when their shapes differ)
        i, j = rng.integers(e, size=2)
        a["ids"][[i, j]] = a["ids"][[j, i]]
    return a


@pytest.mark.parametrize("k", range(len(GRAPHS)))
def test_scan_flags_exactly_what_the_numpy_checks_reject(k: int) -> None:
    g, rng = GRAPHS[k], np.random.default_rng(k)
    bad = 0
    for _ in range(150):
        a = _corrupt(rng, g)
        err = _numpy_error(g, a)
        assert _scan_ok(g, a) == (err is None), err
        bad += err is not None
        if err is not None:  # from_arrays raises the numpy message
            with pytest.raises(GraphError) as info:
                Graph.from_arrays(g.vocab, a["op_ids"], a["ptr"], a["ids"], attrs=g.attrs,
                                  instance=g.instance, outputs=a["outputs"])
            assert str(info.value) == err
    assert bad > 20  # the corruptions do hit the checks
