"""Attrs outside their domain (a label past the classes, an id past its table, a count that
does not match the operands, a packed code no packer makes) are a ``ValueError`` naming the
batch row and the value, wrapped by the executor in an ``ExecutionError`` naming the batch:
never torch's bare ``IndexError``, a silent wrap-around, or rows the compiled loops read
past their ends (``edbatch/executor/_attr_checks.py``, ``_ggnn_checks.py``)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from edbatch.api import DynamicBatch
from edbatch.errors import ExecutionError, GraphError, InvalidActionError
from edbatch.executor import KERNELS, init_params
from edbatch.executor._attr_checks import (
    _first_miscount,
    _first_miscount_numpy,
    check_range,
    check_slot_counts,
)
from edbatch.executor._ggnn_checks import _code_check, _count_check, check_counts
from edbatch.workloads import make_workload
from edbatch.workloads.ggnn_molecules import EMBED_ROWS, update_attr
from tests.executor.test_kernels import catalogue, random_attrs, random_inputs


def _first(kind: str) -> tuple[object, dict[str, torch.Tensor]]:
    return catalogue()[kind][0]


@pytest.mark.parametrize(("kind", "bad", "message"), [
    ("tree_lstm.loss", 5, "label 5, outside 0..4 (5 classes); its attr must be a class index"),
    ("lattice_lstm.loss", -1, "label -1, outside 0..17"),
    ("bilstm.loss", 99, "label 99, outside"),
    ("moe.loss", -3, "label -3, outside"),
    ("module_net.answer", 28, "answer 28, outside 0..27 (28 answers)"),
    ("module_net.answer", -1, "answer -1, outside"),
    ("tree_lstm_sick.sim", 999, "score attr 999, outside 1000..5000"),
    ("tree_lstm_sick.sim", 5001, "score attr 5001, outside 1000..5000"),
    ("module_net.object", -1, "object code -1, outside"),
    ("module_net.object", 2 ** 40, "make it with edbatch.workloads.module_net.pack_object"),
    ("tree_lstm.leaf", 10 ** 9, "id 1000000000, outside"),
    ("lattice_lstm.char_arc", -2, "id -2, outside"),
    ("parser.embed", -1, "its attr must be word * "),
])
def test_an_attr_outside_its_domain_is_named(kind: str, bad: int, message: str) -> None:
    op, params = _first(kind)
    inputs = random_inputs(op, 3, torch.Generator().manual_seed(0))  # type: ignore[arg-type]
    good = 1000 if kind == "tree_lstm_sick.sim" else 0
    attrs = torch.tensor([good, bad, good])
    with pytest.raises(ValueError, match="row 1 of the batch has .*" + re.escape(message)):
        KERNELS[kind](op, inputs, params, attrs)


@pytest.mark.parametrize("attr", [-1, -7, 10 ** 6, 2 ** 40])
def test_every_kind_names_a_wild_attr_or_ignores_it(attr: int) -> None:
    """Every fixed-arity kind of the real workloads, one row's attr far outside any domain:
    the kernel raises a ``ValueError`` (named) or gives finite values (it does not read the
    attr, or -1 means unused), never torch's ``IndexError`` / ``RuntimeError`` or a read
    past an array (the variadic kinds: the counting tests below)."""
    raw = []
    for kind, entries in catalogue().items():
        op, params = entries[0]
        if op.in_shapes is None:
            continue
        gen = torch.Generator().manual_seed(0)
        inputs, attrs = random_inputs(op, 3, gen), random_attrs(kind, op, params, 3, gen)
        attrs[1] = attr
        try:
            y = KERNELS[kind](op, inputs, params, attrs)
        except ValueError as e:
            assert f" {attr}," in str(e) or f" {attr} " in str(e), (kind, str(e))
            continue
        except Exception as e:  # collected: the assertion names them all
            raw.append(f"{kind}: {type(e).__name__}: {e}")
            continue
        if not bool(torch.isfinite(y).all()):
            raw.append(f"{kind}: non-finite values")
    assert not raw, raw


def test_a_packed_moe_choice_outside_the_experts_is_named() -> None:
    op, params = _first("moe.combine")
    gen = torch.Generator().manual_seed(0)
    experts, k, width = 4, 2, 8
    inputs = [torch.randn(2, experts, generator=gen)] + \
        [torch.randn(2, width, generator=gen) for _ in range(1 + k)]
    fine = KERNELS["moe.combine"](op, inputs, params, torch.tensor([0, experts ** k - 1]))
    assert fine.shape == (2, width)
    with pytest.raises(ValueError, match=r"row 0 of the batch has packed choice 16, outside "
                       r"0\.\.15 \(2 of 4 experts\); make it with .*pack_choice"):
        KERNELS["moe.combine"](op, inputs, params, torch.tensor([experts ** k, 0]))


# ---------------------------------------------------------------------- counting attrs
def test_check_counts_names_the_row_or_the_total() -> None:
    check_counts(np.array([2, 0, 1]), 3)
    with pytest.raises(ValueError, match=r"row 1's attr -1 counts -1, outside 0\.\.3"):
        check_counts(np.array([2, -1, 2]), 3)
    with pytest.raises(ValueError, match=r"the nodes' attrs count 4 in all, the batch has 3"):
        check_counts(np.array([2, 0, 2]), 3)
    with pytest.raises(ValueError, match="outside 0..3"):  # a huge count: no 2**40 loop
        check_counts(np.array([2 ** 40]), 3)
    ok = np.array([update_attr([0, 3]), update_attr([]), update_attr([1])])
    check_counts(ok, 3, 3)
    for bad in (-1, update_attr([2]) | (1 << 20)):
        with pytest.raises(ValueError, match=f"row 1 of the batch has attr {bad}, which is not"):
            check_counts(np.array([ok[0], bad, ok[2]]), 3, 3)


def test_the_compiled_checks_equal_their_python_twins() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        attrs = rng.integers(-3, 300, size=int(rng.integers(0, 7)))
        rows = int(rng.integers(0, 12))
        assert tuple(_count_check(attrs, rows)) == tuple(_count_check.py_func(attrs, rows))
        assert _code_check(attrs, 3) == _code_check.py_func(attrs, 3)
    for _ in range(300):  # the graph check: random CSR graphs, op types with and without rules
        n = int(rng.integers(0, 9))
        ptr = np.concatenate([[0], np.cumsum(rng.integers(0, 4, size=n))]).astype(np.int64)
        op_ids = rng.integers(0, 3, size=n).astype(np.int32)
        attrs = (np.diff(ptr) - rng.integers(0, 2, size=n) + rng.integers(-1, 2, size=n)
                 ).astype(np.int64)
        fixed, mask = np.array([-1, 1, 0]), np.array([-1, 7, -1])
        assert _first_miscount(op_ids, ptr, attrs, fixed, mask) == \
            _first_miscount_numpy(op_ids, ptr, attrs, fixed, mask)


def test_check_slot_counts_matches_the_slots() -> None:
    check_slot_counts(torch.tensor([2, 0, 1]), [2, 1])
    with pytest.raises(ValueError, match=r"give \[2, 2\] nodes .* the operands \[2, 1\]"):
        check_slot_counts(torch.tensor([2, 0, 2]), [2, 1])
    with pytest.raises(ValueError, match="row 0 of the batch has attr 3, but its nodes have"):
        check_slot_counts(torch.tensor([3, 0]), [1, 1])


def test_check_range_is_quiet_inside() -> None:
    check_range(torch.tensor([0, 4]), 5, "label", "5 classes", "fix")
    check_range(torch.tensor([], dtype=torch.int64), 5, "label", "5 classes", "fix")
    with pytest.raises(ValueError, match="row 1 of the batch has label 5"):
        check_range(torch.tensor([0, 5]), 5, "label", "5 classes", "fix")


# ---------------------------------------------------------------------- through the API
def _ggnn_batch(update_attr_of: object = None, readout_attr: object = None,
                code: object = None) -> float:
    """Two ESOL molecules recorded as a user would, one attr replaced; the loss."""
    wl = make_workload("ggnn_molecules", **make_workload("ggnn_molecules").test_kwargs())
    insts = list(wl.load("train"))[:2]
    batch = DynamicBatch.from_workload(wl, init_params(wl, torch.Generator().manual_seed(0)))
    embed, update, readout, loss = (batch.op(f"ggnn.{n}")
                                    for n in ("embed", "update", "readout", "loss"))
    for i, inst in enumerate(insts):
        with batch.instance():
            h = [embed(attr=code if code is not None and i == 0 and v == 0 else c)
                 for v, c in enumerate(inst.atom_codes)]
            for _ in range(wl.rounds):
                h = [update(*[h[u] for u in ops],
                            attr=update_attr_of if update_attr_of is not None and i == 0
                            and v == 0 else a)
                     for v, (ops, a) in enumerate(zip(inst.update_operands, inst.update_attrs))]
            n = readout_attr if readout_attr is not None and i == 0 else len(h)
            batch.add_loss(loss(readout(*h, attr=n), attr=inst.target_code))
    return float(batch.run().loss.detach())


def test_ggnn_attrs_that_miscount_their_operands_are_refused() -> None:
    assert np.isfinite(_ggnn_batch())
    for attr, counts in ((0, 0), (-1, 7), (7, 7), (2 ** 40, 0)):
        with pytest.raises(GraphError, match=rf"op type 'ggnn\.update'\) has attr {attr}, "
                           rf"which counts {counts} operands after the first 1, but the node "
                           r"has \d; give it the count of those operands in the attr's low 3"):
            _ggnn_batch(update_attr_of=attr)
    for attr in (-1, 10 ** 12, 1):
        with pytest.raises(GraphError, match=rf"op type 'ggnn\.readout'\) has attr {attr}, "
                           rf"which counts {attr} operands, but the node has"):
            _ggnn_batch(readout_attr=attr)
    # the right count with bits above the bond types: the kernel's check
    first = make_workload("ggnn_molecules").load("train")[0].update_attrs[0]
    with pytest.raises(ExecutionError, match=r"'ggnn\.update'.* which is not a neighbour count"):
        _ggnn_batch(update_attr_of=first | (1 << 30))


def test_a_swap_of_two_nodes_counts_is_refused() -> None:
    """Totals and per-slot sizes equal, only which node has which count differs: only the
    graph check (``counts_attr``) can tell."""
    wl = make_workload("tree_lstm_sick", **make_workload("tree_lstm_sick").test_kwargs())
    params = init_params(wl, torch.Generator().manual_seed(0))
    for swap in (False, True):
        batch = DynamicBatch.from_workload(wl, params)
        embed, node, sim = (batch.op(f"tree_lstm_sick.{n}") for n in ("embed", "node", "sim"))
        with batch.instance():
            leaves = [node(embed(attr=w), attr=0) for w in (1, 2, 3)]
            one = node(embed(attr=4), leaves[0], attr=2 if swap else 1)
            two = node(embed(attr=5), leaves[1], leaves[2], attr=1 if swap else 2)
            batch.add_loss(sim(one, two, attr=3000))
        if not swap:
            assert np.isfinite(float(batch.run().loss.detach()))
            continue
        with pytest.raises(GraphError, match=r"op type 'tree_lstm_sick\.node'\) has attr 2, "
                           r"which counts 2 operands after the first 1, but the node has 1"):
            batch.run()


def test_a_ggnn_atom_code_no_packer_makes_is_refused() -> None:
    limit = 1
    from edbatch.workloads.ggnn_molecules import FEATURE_RANGES
    for lo, hi in FEATURE_RANGES:
        limit *= hi - lo + 1
    assert EMBED_ROWS < limit
    _ggnn_batch(code=limit - 1)
    for code in (-1, limit, 2 ** 40):
        with pytest.raises(ExecutionError, match=f"atom code {code}, outside 0..{limit - 1}"):
            _ggnn_batch(code=code)


def test_a_parser_class_outside_its_classes_is_an_invalid_action() -> None:
    wl = make_workload("transition_parser", **make_workload("transition_parser").test_kwargs())
    assert wl.action_of(0)[1] == -1
    wl.action_of(wl.num_classes - 1)
    for cls in (-1, wl.num_classes, 10 ** 12):
        with pytest.raises(InvalidActionError, match=f"class id {cls} is outside "
                           f"0..{wl.num_classes - 1}"):
            wl.action_of(cls)


def test_the_ggnn_packers_refuse_what_their_bits_cannot_hold() -> None:
    """(8 neighbours overflowed the 3 count bits into the bond types, a bond type 4 or a
    feature past its range wrapped into another one's bits.)"""
    from edbatch.workloads.ggnn_molecules import FEATURE_RANGES, pack_atom, unpack_atom

    assert update_attr([0, 3, 1]) == 3 | ((0 | 3 << 2 | 1 << 4) << 3)
    low = [lo for lo, _ in FEATURE_RANGES]
    assert len(unpack_atom(pack_atom(low))) == len(FEATURE_RANGES)
    for bonds, match in (([0] * 8, "8 neighbours, more than the 7"),
                         ([4], "bond type 4 of neighbour 0 is no integer in 0..3"),
                         ([0, -1], "bond type -1 of neighbour 1"), ([1.5], "bond type 1.5")):
        with pytest.raises(GraphError, match=re.escape(match)):
            update_attr(bonds)
    hi = FEATURE_RANGES[1][1]
    for features, match in ((low[:-1], "5 features, expected 6"),
                            ([low[0], hi + 1, *low[2:]], f"feature 1 is {hi + 1}, expected an "
                                                         f"integer in 0..{hi}"),
                            ([0.5, *low[1:]], "feature 0 is 0.5")):
        with pytest.raises(GraphError, match=re.escape(match)):
            pack_atom(features)


def test_the_moe_and_clevr_packers_refuse_values_outside_their_digits() -> None:
    from edbatch.workloads.module_net import pack_object
    from edbatch.workloads.moe import pack_choice

    assert pack_choice([1, 3], 4) == 13
    for chosen, bad in (([4, 0], "choice 0 is 4"), ([0, -1], "choice 1 is -1"),
                        ([1.5], "choice 0 is 1.5")):
        with pytest.raises(GraphError, match=re.escape(bad) + r", expected an expert index in "
                                                              r"0\.\.3"):
            pack_choice(chosen, 4)
    with pytest.raises(GraphError, match=r"object field value 1\.5 outside 0\.\.1"):
        pack_object([1.5, 0, 0, 0], 0.0, 0.0)
