"""Gated graph neural network (Li et al., GGNN) regressing ESOL log solubility.

Each molecule of ``data/esol/`` (see :mod:`edbatch.data.molecules`) is a graph of heavy atoms
and typed bonds. With ``H = hidden_dim``, ``T = rounds``, ``sig`` the sigmoid and ``⊙`` the
element-wise product:

* **embed** (atom ``v``): ``h_v^0 = sum_f E[offset_f + x_vf]`` over the six atom features
  (element, degree, charge, aromatic, hydrogen count, ring; one table ``ggnn.atom_emb`` of
  :data:`EMBED_ROWS` rows, each feature its own block of rows).
* **message** (round ``t``, atom ``u``, bond type ``b``): ``m = A_b h_u^t + c_b``; one op type
  per bond type (single, double, triple, aromatic). ``m`` depends on the source and the bond
  type only, so it is computed once per (atom, bond type) present and read by every
  neighbour over such a bond.
* **update**: ``a_v = sum of the messages into v`` (zero for an isolated atom), then the GRU
  of :func:`~edbatch.workloads.primitives.emit_gru` with input ``a_v`` and state ``h_v^t``:
  ``[r z] = sig(W_rz [a; h] + b)``; ``c = tanh(W_c [a; r ⊙ h] + b_c)``;
  ``h' = z ⊙ h + (1 - z) ⊙ c``. Weights are shared over the ``T`` rounds.
* **readout** (Li et al.'s graph-level output, on ``h^T`` only):
  ``g = sum_v sig(W_i h_v + b_i) ⊙ tanh(W_j h_v + b_j)``.
* **loss**: ``p = w_p^T tanh(W_h g + b_h) + b_p``; ``(p - z)^2`` with ``z`` the molecule's
  *standardised* target ``(y - mean) / std`` (mean and std of the train split, see
  :meth:`GGNNMolecules.target_stats`). Graph attrs are ``int64``, so the loss node's attr
  carries ``round(z * TARGET_SCALE)`` and the kernel divides it back (``1e-6`` standard
  deviations of quantisation, about ``2e-6`` log units). The test RMSE in log units is
  ``std * sqrt(mean (p - z)^2)``.

Granularities (same parameters):

* ``"cell"``: ``ggnn.embed`` (no operands, attr = the packed atom features, see
  :func:`pack_atom`), ``ggnn.update`` (one round at one atom, variadic: its state, then its
  neighbours' states in edge order; attr = :func:`update_attr` of their bond types; the
  kernel sums the neighbour states per bond type and computes every message of a batch in
  one GEMM, ``sum_b A_b S_b + deg_b c_b``, as PyG computes messages per bond type over a
  gathered block; all atoms' updates batch together whatever their degree),
  ``ggnn.readout`` (variadic over the atoms' final states; attr = their number),
  ``ggnn.loss`` (attr = coded target, out ``(1,)``), ``loss_sum``. The messages' op types
  per bond type are the primitive granularity's (below).
* ``"primitive"``: DyNet-style ops: six ``lookup`` rows and five ``add/H`` per atom, one
  ``affine.ggnn.msg.<bond>`` per message, binary ``add/H`` chains for the message sums
  (``zero/H`` for an isolated atom), the primitive GRU, per atom two affines, ``sigmoid``,
  ``tanh``, ``cmult`` and an ``add/H`` chain for the readout, then ``affine``, ``tanh``,
  ``affine`` and ``ggnn.sq_err`` (attr = coded target).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edbatch.data.molecules import (
    ATOM_FEATURES,
    BOND_TYPES,
    ELEMENTS,
    Molecule,
    load_esol,
    load_esol_split,
)
from edbatch.errors import GraphError, is_integer
from edbatch.graph import GraphBuilder, OpType
from edbatch.workloads._seq import affine_params, check_positive, declare_cell, gru_params
from edbatch.workloads.base import Workload
from edbatch.workloads.primitives import GRUNames, OpSet, emit_gru

__all__ = ["COUNT_BITS", "EMBED_ROWS", "FEATURE_RANGES", "TARGET_SCALE", "GGNNMolecules",
           "MoleculeInstance", "pack_atom", "unpack_atom", "update_attr"]

#: ``(low, high)`` allowed values of each column of ``Molecule.atoms`` (ATOM_FEATURES order).
FEATURE_RANGES: tuple[tuple[int, int], ...] = (
    (0, len(ELEMENTS) - 1), (0, 5), (-2, 2), (0, 1), (0, 4), (0, 1))
_SIZES = tuple(hi - lo + 1 for lo, hi in FEATURE_RANGES)
#: First row of each feature's block in ``ggnn.atom_emb``.
OFFSETS: tuple[int, ...] = tuple(int(x) for x in np.cumsum((0, *_SIZES[:-1])))
#: Rows of the atom embedding table ``ggnn.atom_emb``.
EMBED_ROWS = sum(_SIZES)
#: The loss node's attr is ``round(z * TARGET_SCALE)`` for the standardised target ``z``.
TARGET_SCALE = 1_000_000
_PREFIX = "ggnn"
#: Low bits of a ``ggnn.update`` attr that count its neighbour operands (:func:`update_attr`).
COUNT_BITS = 3


def update_attr(bond_types: Sequence[int]) -> int:
    """The attr of a ``ggnn.update`` node whose repeated operands are neighbour states over
    bonds of these types (in operand order): their number in the low :data:`COUNT_BITS`
    bits, then two bits per operand's bond type (operand ``k`` at bits ``2k`` above).

    Raises:
        GraphError: more neighbours than the count bits hold, or a bond type outside
            ``0 .. len(BOND_TYPES) - 1``.
    """
    if len(bond_types) >= 1 << COUNT_BITS:
        raise GraphError(f"update_attr: {len(bond_types)} neighbours, more than the "
                         f"{(1 << COUNT_BITS) - 1} its {COUNT_BITS} count bits hold")
    code = 0
    for k, t in enumerate(bond_types):
        if not is_integer(t) or not 0 <= t < len(BOND_TYPES):
            raise GraphError(f"update_attr: bond type {t!r} of neighbour {k} is no integer in "
                             f"0..{len(BOND_TYPES) - 1} ({', '.join(BOND_TYPES)})")
        code |= int(t) << (2 * k)
    return len(bond_types) | (code << COUNT_BITS)


def pack_atom(features: Sequence[int]) -> int:
    """One atom's features as a mixed-radix integer (feature 0 least significant).

    Raises:
        GraphError: not one integer per feature, or a value outside :data:`FEATURE_RANGES`.
    """
    if len(features) != len(FEATURE_RANGES):
        raise GraphError(f"pack_atom: {len(features)} features, expected "
                         f"{len(FEATURE_RANGES)} (ATOM_FEATURES order)")
    code, radix = 0, 1
    for f, (value, (lo, hi), size) in enumerate(zip(features, FEATURE_RANGES, _SIZES,
                                                     strict=True)):
        if not is_integer(value) or not lo <= value <= hi:
            raise GraphError(f"pack_atom: feature {f} is {value!r}, expected an integer in "
                             f"{lo}..{hi} (FEATURE_RANGES)")
        code += (int(value) - lo) * radix
        radix *= size
    return code


def unpack_atom(code: int) -> list[int]:
    """The rows of ``ggnn.atom_emb`` an atom packed by :func:`pack_atom` reads."""
    rows = []
    for offset, size in zip(OFFSETS, _SIZES, strict=True):
        rows.append(offset + code % size)
        code //= size
    return rows


@dataclass(frozen=True, slots=True, eq=False)
class MoleculeInstance:
    """A molecule pre-encoded for emission.

    Attributes:
        split: the split it was loaded from.
        index: its position in that split.
        molecule: the parsed molecule.
        atom_codes: :func:`pack_atom` code of each atom.
        sources: per atom, the ``(source atom, bond type)`` pairs of its incoming messages,
            in edge order.
        target_code: ``round(z * TARGET_SCALE)`` of the standardised target ``z``.
        update_operands: per atom ``v``, the operands of its ``ggnn.update``: ``v``, then
            its sources (derived from ``sources``).
        update_attrs: per atom, the :func:`update_attr` of its incoming bond types (derived).
    """

    split: str
    index: int
    molecule: Molecule
    atom_codes: tuple[int, ...]
    sources: tuple[tuple[tuple[int, int], ...], ...]
    target_code: int
    update_operands: tuple[tuple[int, ...], ...] = field(init=False, repr=False)
    update_attrs: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """Derive the per-atom update operands and attrs once (recording reads them)."""
        object.__setattr__(self, "update_operands", tuple(
            (v, *(u for u, _ in srcs)) for v, srcs in enumerate(self.sources)))
        object.__setattr__(self, "update_attrs", tuple(
            update_attr([t for _, t in srcs]) for srcs in self.sources))

    @property
    def n_atoms(self) -> int:
        """Number of heavy atoms."""
        return len(self.atom_codes)

    @property
    def target(self) -> float:
        """The standardised target ``z`` as the loss reads it."""
        return self.target_code / TARGET_SCALE


class GGNNMolecules(Workload):
    """GGNN over ESOL molecules (see the module docstring).

    Example:
        >>> w = GGNNMolecules(hidden_dim=8, rounds=2)
        >>> g = w.minibatch("valid", range(2))
        >>> g.vocab[int(g.op_ids[0])].name, g.vocab[int(g.op_ids[-1])].name
        ('ggnn.embed', 'loss_sum')
    """

    name = "ggnn_molecules"
    default_eval_split = "valid"
    default_val_split = "valid"
    real_data = True
    hand_backward = True

    @classmethod
    def test_kwargs(cls, dim: int = 8, hidden: int | None = None, *, short: bool = False
                    ) -> dict[str, Any]:
        """Small atom states (``hidden``, else ``dim``) and two rounds."""
        return {"hidden_dim": dim if hidden is None else hidden, "rounds": 2}

    def __init__(self, granularity: str = "cell", hidden_dim: int = 64, rounds: int = 4,
                 data_dir: str | Path | None = None) -> None:
        """Declare the op vocabulary.

        Args:
            granularity: ``"cell"`` or ``"primitive"``.
            hidden_dim: atom state size ``H`` (also the readout and loss-MLP width).
            rounds: message-passing rounds ``T``.
            data_dir: folder holding ``esol/``; defaults to ``data/``.
        """
        super().__init__(granularity, data_dir)
        check_positive(hidden_dim=hidden_dim, rounds=rounds)
        self.hidden_dim, self.rounds = hidden_dim, rounds
        self._molecules: list[Molecule] | None = None
        self._split_ids: dict[str, list[int]] | None = None
        self._stats: tuple[float, float] | None = None
        self._declare_vocab()

    # ------------------------------------------------------------------ vocabulary
    def _declare_cells(self, ops: OpSet) -> None:
        p, h = _PREFIX, self.hidden_dim
        declare_cell(ops, f"{p}.embed", (), (h,), {f"{p}.atom_emb": (EMBED_ROWS, h)})
        update = {k: v for bond in BOND_TYPES
                  for k, v in affine_params(f"{p}.msg.{bond}", h, h).items()}
        update.update(gru_params(f"{p}.gru", h, h))
        ops.add(OpType(f"{p}.update", f"{p}.update", None, (h,), tuple(update)), update)
        readout = {**affine_params(f"{p}.gate", h, h), **affine_params(f"{p}.proj", h, h)}
        ops.add(OpType(f"{p}.readout", f"{p}.readout", None, (h,), tuple(readout)), readout)
        declare_cell(ops, f"{p}.loss", ((h,),), (1,), affine_params(f"{p}.hid", h, h),
                     affine_params(f"{p}.pred", h, 1))

    def _declare_primitives(self, ops: OpSet) -> None:
        p, h = _PREFIX, self.hidden_dim
        self._lookup = ops.lookup(f"{p}.atom_emb", EMBED_ROWS, h)
        self._msg = tuple(ops.affine(f"{p}.msg.{bond}", h, h) for bond in BOND_TYPES)
        self._zero = ops.zero(h)
        self._add = ops.binary("add", h)
        self._gru = GRUNames.declare(ops, f"{p}.gru", h, h)
        self._gate, self._proj = ops.affine(f"{p}.gate", h, h), ops.affine(f"{p}.proj", h, h)
        self._sigmoid, self._tanh = ops.unary("sigmoid", h), ops.unary("tanh", h)
        self._cmult = ops.binary("cmult", h)
        self._hid, self._pred = ops.affine(f"{p}.hid", h, h), ops.affine(f"{p}.pred", h, 1)
        self._sq_err = ops.add(OpType(f"{p}.sq_err", f"{p}.sq_err", ((1,),), (1,)))

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape (identical at both granularities)."""
        return dict(self._params)

    # ------------------------------------------------------------------ data
    @property
    def splits(self) -> tuple[str, ...]:
        """``("train", "valid", "test")`` of ``data/esol/split.json``."""
        return ("train", "valid", "test")

    def _esol(self) -> tuple[list[Molecule], dict[str, list[int]]]:
        if self._molecules is None or self._split_ids is None:
            folder = self.data_dir / "esol"
            self._molecules = load_esol(folder / "delaney-processed.csv")
            self._split_ids = load_esol_split(folder / "split.json", len(self._molecules))
        return self._molecules, self._split_ids

    def target_stats(self) -> tuple[float, float]:
        """``(mean, std)`` of the train split's log solubility (the target standardisation)."""
        if self._stats is None:
            molecules, split = self._esol()
            y = np.array([molecules[i].y for i in split["train"]], dtype=np.float64)
            self._stats = (float(y.mean()), float(y.std()))
        return self._stats

    def _load(self, split: str) -> Sequence[MoleculeInstance]:
        molecules, ids = self._esol()
        return [self.encode(molecules[i], split, k) for k, i in enumerate(ids[split])]

    def encode(self, mol: Molecule, split: str = "<molecule>", index: int = 0
               ) -> MoleculeInstance:
        """Pre-encode one molecule (raises :class:`GraphError` on an atom feature outside
        :data:`FEATURE_RANGES`, naming the molecule, atom and feature)."""
        atoms = np.asarray(mol.atoms)
        if atoms.ndim != 2 or atoms.shape[1] != len(ATOM_FEATURES) or len(atoms) == 0:
            raise GraphError(f"molecule #{index} of split {split!r} ({mol.smiles!r}): atoms "
                             f"of shape {atoms.shape}, expected (n >= 1, {len(ATOM_FEATURES)})")
        for f, (lo, hi) in enumerate(FEATURE_RANGES):
            bad = np.flatnonzero((atoms[:, f] < lo) | (atoms[:, f] > hi))
            if len(bad):
                raise GraphError(
                    f"molecule #{index} of split {split!r} ({mol.smiles!r}): atom {bad[0]} "
                    f"has {ATOM_FEATURES[f]} {int(atoms[bad[0], f])}, outside the "
                    f"embedding's range {lo}..{hi}; drop the molecule or widen "
                    f"FEATURE_RANGES in edbatch/workloads/ggnn_molecules.py")
        incoming: list[list[tuple[int, int]]] = [[] for _ in range(len(atoms))]
        for (src, dst), bond in zip(mol.edges.tolist(), mol.bond_types.tolist(), strict=True):
            incoming[dst].append((src, bond))
        worst = max(range(len(incoming)), key=lambda v: len(incoming[v]))
        if len(incoming[worst]) >= 1 << COUNT_BITS:
            raise GraphError(f"molecule #{index} of split {split!r} ({mol.smiles!r}): atom "
                             f"{worst} has {len(incoming[worst])} bonds; ggnn.update's attr "
                             f"encodes at most {(1 << COUNT_BITS) - 1}: drop the molecule")
        mean, std = self.target_stats()
        code = round((mol.y - mean) / std * TARGET_SCALE)
        return MoleculeInstance(split, index, mol, tuple(pack_atom(a) for a in atoms.tolist()),
                                tuple(tuple(s) for s in incoming), int(code))

    # ------------------------------------------------------------------ emission
    def emit(self, instance: MoleculeInstance, builder: GraphBuilder) -> list[int]:
        """Append one molecule's nodes; return its loss node id."""
        if self.granularity == "cell":
            return self._emit_cells(instance, builder)
        return self._emit_primitives(instance, builder)

    @staticmethod
    def _message_keys(inst: MoleculeInstance) -> list[tuple[int, int]]:
        """The distinct (source atom, bond type) messages of one round, in first-use order."""
        return list(dict.fromkeys(pair for srcs in inst.sources for pair in srcs))

    def _emit_cells(self, inst: MoleculeInstance, b: GraphBuilder) -> list[int]:
        p, add = _PREFIX, b.add
        h = [add(f"{p}.embed", attr=code) for code in inst.atom_codes]
        for _ in range(self.rounds):
            get = h.__getitem__
            h = [add(f"{p}.update", *map(get, ops), attr=attr)
                 for ops, attr in zip(inst.update_operands, inst.update_attrs, strict=True)]
        g = add(f"{p}.readout", *h, attr=len(h))
        return [add(f"{p}.loss", g, attr=inst.target_code)]

    def _sum_chain(self, b: GraphBuilder, nodes: Sequence[int]) -> int:
        total = nodes[0]
        for other in nodes[1:]:
            total = b.add(self._add, total, other)
        return total

    def _emit_primitives(self, inst: MoleculeInstance, b: GraphBuilder) -> list[int]:
        add = b.add
        h = [self._sum_chain(b, [add(self._lookup, attr=r) for r in unpack_atom(code)])
             for code in inst.atom_codes]
        keys = self._message_keys(inst)
        for _ in range(self.rounds):
            msg = {(u, t): add(self._msg[t], h[u]) for u, t in keys}
            new = []
            for v, srcs in enumerate(inst.sources):
                a = self._sum_chain(b, [msg[k] for k in srcs]) if srcs else add(self._zero)
                new.append(emit_gru(b, self._gru, a, h[v]))
            h = new
        terms = [add(self._cmult, add(self._sigmoid, add(self._gate, x)),
                     add(self._tanh, add(self._proj, x))) for x in h]
        g = self._sum_chain(b, terms)
        pred = add(self._pred, add(self._tanh, add(self._hid, g)))
        return [add(self._sq_err, pred, attr=inst.target_code)]
