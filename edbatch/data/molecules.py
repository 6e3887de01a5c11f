"""Molecules as atom/bond graphs: the ESOL (Delaney) solubility set in ``data/esol/``.

The CSV (MoleculeNet's ``delaney-processed.csv``) has one molecule per row; the loader reads
the ``smiles`` column and the measured log solubility (mol/L) and parses every SMILES with
RDKit into a graph:

* **atoms**: one row of :data:`ATOM_FEATURES` per heavy atom (hydrogens are implicit and
  counted in ``h_count``): element index in :data:`ELEMENTS`, degree (heavy neighbours),
  formal charge, aromatic flag (0/1), total hydrogen count, ring membership (0/1).
* **bonds**: every RDKit bond appears twice, once per direction, in ``edges`` (shape
  ``(2 * n_bonds, 2)``, source then target); ``bond_types`` holds the index into
  :data:`BOND_TYPES` (single, double, triple, aromatic) for each directed edge.

The fixed split (``data/esol/split.json``) is random, 80/10/10 over the 1128 rows, drawn with
``numpy.random.default_rng(0)``; :func:`make_esol_split` regenerates it bit for bit
(``python -m edbatch.data.generate esol-split``).

RDKit is imported on first use so that ``import edbatch.data`` stays cheap.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edbatch.data._text import read_json, read_text, shorten
from edbatch.errors import DataFormatError

__all__ = [
    "ATOM_FEATURES",
    "BOND_TYPES",
    "ELEMENTS",
    "ESOL_TARGET",
    "Molecule",
    "load_esol",
    "load_esol_split",
    "make_esol_split",
    "parse_smiles",
]

#: Element vocabulary: the nine elements of ESOL plus B, Si and Se (common in organic sets).
ELEMENTS: tuple[str, ...] = ("C", "N", "O", "S", "F", "Cl", "Br", "I", "P", "B", "Si", "Se")
#: Column meaning of :attr:`Molecule.atoms`.
ATOM_FEATURES: tuple[str, ...] = ("element", "degree", "charge", "aromatic", "h_count",
                                  "in_ring")
#: Bond type vocabulary (index = value in :attr:`Molecule.bond_types`).
BOND_TYPES: tuple[str, ...] = ("single", "double", "triple", "aromatic")
#: Column of the regression target in the ESOL CSV.
ESOL_TARGET = "measured log solubility in mols per litre"
_SPLIT_FRACTIONS = (0.8, 0.1, 0.1)


@dataclass(frozen=True, eq=False)
class Molecule:
    """One molecule as a graph with a scalar target.

    Attributes:
        name: Compound name (``Compound ID`` column), may be empty.
        smiles: The SMILES as written in the file (stripped of surrounding spaces).
        y: Measured log solubility in mol/L.
        atoms: ``int64`` array ``(n_atoms, len(ATOM_FEATURES))``.
        edges: ``int64`` array ``(2 * n_bonds, 2)`` of directed (source, target) atom pairs.
        bond_types: ``int64`` array ``(2 * n_bonds,)`` of indices into :data:`BOND_TYPES`.
    """

    name: str
    smiles: str
    y: float
    atoms: np.ndarray
    edges: np.ndarray
    bond_types: np.ndarray

    @property
    def n_atoms(self) -> int:
        """Number of (heavy) atoms."""
        return int(self.atoms.shape[0])

    @property
    def n_bonds(self) -> int:
        """Number of undirected bonds."""
        return int(self.edges.shape[0] // 2)


def parse_smiles(smiles: str, path: str | Path = "<smiles>", line: int = 1,
                 elements: tuple[str, ...] = ELEMENTS) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray]:
    """Parse one SMILES into ``(atoms, edges, bond_types)`` (see :class:`Molecule`).

    Args:
        smiles: The SMILES string.
        path: File named in errors.
        line: Line named in errors.
        elements: The element vocabulary (atom feature 0 is the index into it).

    Raises:
        DataFormatError: If RDKit cannot parse the SMILES, an atom's element is not in
            ``elements``, or a bond is not single/double/triple/aromatic.
    """
    from rdkit import Chem, rdBase

    with rdBase.BlockLogs():
        mol = Chem.MolFromSmiles(smiles) if smiles else None
    if mol is None:
        raise DataFormatError(path, line, f"malformed SMILES {shorten(smiles)}",
                              "a SMILES that RDKit parses",
                              "correct the SMILES (check brackets, ring closures, valences)")
    index = {sym: i for i, sym in enumerate(elements)}
    atoms = np.zeros((mol.GetNumAtoms(), len(ATOM_FEATURES)), dtype=np.int64)
    for atom in mol.GetAtoms():
        sym = atom.GetSymbol()
        if sym not in index:
            raise DataFormatError(
                path, line, f"element {sym!r} in SMILES {shorten(smiles)}",
                f"an element of the vocabulary {', '.join(elements)}",
                "drop the molecule or pass a larger `elements` vocabulary")
        atoms[atom.GetIdx()] = (index[sym], atom.GetDegree(), atom.GetFormalCharge(),
                                int(atom.GetIsAromatic()), atom.GetTotalNumHs(),
                                int(atom.IsInRing()))
    kinds = {Chem.BondType.SINGLE: 0, Chem.BondType.DOUBLE: 1, Chem.BondType.TRIPLE: 2,
             Chem.BondType.AROMATIC: 3}
    edges = np.zeros((2 * mol.GetNumBonds(), 2), dtype=np.int64)
    types = np.zeros(2 * mol.GetNumBonds(), dtype=np.int64)
    for k, bond in enumerate(mol.GetBonds()):
        kind = kinds.get(bond.GetBondType())
        if kind is None:
            raise DataFormatError(
                path, line, f"bond type {bond.GetBondType()} in SMILES {shorten(smiles)}",
                f"one of {', '.join(BOND_TYPES)}", "drop the molecule")
        a, b = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        edges[2 * k] = (a, b)
        edges[2 * k + 1] = (b, a)
        types[2 * k : 2 * k + 2] = kind
    return atoms, edges, types


def load_esol(path: str | Path, elements: tuple[str, ...] = ELEMENTS) -> list[Molecule]:
    """Load the ESOL CSV (header row with ``smiles`` and :data:`ESOL_TARGET` columns).

    Args:
        path: The CSV file, e.g. ``data/esol/delaney-processed.csv``.
        elements: The element vocabulary.

    Returns:
        One :class:`Molecule` per data row, in file order.

    Raises:
        DataFormatError: Naming ``file:line`` for a missing column, a row with too few
            fields, a missing or non-numeric solubility, or a bad SMILES / element.
    """
    reader = csv.reader(io.StringIO(read_text(path), newline=""))
    header = next(reader, None)
    if header is None:
        raise DataFormatError(path, 1, "an empty file", "a CSV header row")
    header = [h.strip() for h in header]
    for column in ("smiles", ESOL_TARGET):
        if column not in header:
            raise DataFormatError(path, 1, f"header columns {header}",
                                  f"a column named {column!r}",
                                  "use MoleculeNet's delaney-processed.csv header")
    i_smiles, i_y = header.index("smiles"), header.index(ESOL_TARGET)
    i_name = header.index("Compound ID") if "Compound ID" in header else None
    out: list[Molecule] = []
    line = reader.line_num
    for row in reader:
        start, line = line + 1, reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise DataFormatError(path, start, f"{len(row)} fields",
                                  f"{len(header)} fields as in the header")
        raw_y = row[i_y].strip()
        try:
            y = float(raw_y)
        except ValueError:
            y = math.nan
        if not math.isfinite(y):
            found = "an empty solubility" if not raw_y else f"solubility {shorten(raw_y)}"
            raise DataFormatError(path, start, found, "a finite number (log mol/L)",
                                  "fill in the measured value or drop the row")
        smiles = row[i_smiles].strip()
        atoms, edges, types = parse_smiles(smiles, path, start, elements)
        name = row[i_name].strip() if i_name is not None else ""
        out.append(Molecule(name, smiles, y, atoms, edges, types))
    return out


def make_esol_split(n: int, seed: int = 0) -> dict[str, list[int]]:
    """Random 80/10/10 split of ``n`` row indices (0-based, file order), sorted per part.

    Args:
        n: Number of molecules.
        seed: Seed of ``numpy.random.default_rng``.

    Returns:
        ``{"train": [...], "valid": [...], "test": [...]}``.
    """
    perm = np.random.default_rng(seed).permutation(n)
    n_train = round(_SPLIT_FRACTIONS[0] * n)
    n_valid = round(_SPLIT_FRACTIONS[1] * n)
    parts = (perm[:n_train], perm[n_train : n_train + n_valid], perm[n_train + n_valid :])
    return {k: sorted(int(i) for i in p) for k, p in zip(("train", "valid", "test"), parts,
                                                         strict=True)}


def load_esol_split(path: str | Path, n: int | None = None) -> dict[str, list[int]]:
    """Read a split file written by ``python -m edbatch.data.generate esol-split``.

    Args:
        path: The JSON file (``{"seed", "method", "train", "valid", "test"}``).
        n: If given, check that the parts partition ``range(n)``.

    Raises:
        DataFormatError: If a part is missing or (with ``n``) the parts do not partition
            ``range(n)``.
    """
    data = read_json(path, "an ESOL split object {\"train\": [...], \"valid\": [...], "
                           "\"test\": [...]}")
    for part in ("train", "valid", "test"):
        if not isinstance(data, dict) or not isinstance(data.get(part), list):
            found = f"keys {sorted(data)}" if isinstance(data, dict) else \
                f"a JSON {type(data).__name__}"
            raise DataFormatError(path, 1, found, f"a list {part!r}",
                                  "regenerate with `python -m edbatch.data.generate esol-split`")
        bad = [i for i in data[part] if isinstance(i, bool) or not isinstance(i, int)]
        if bad:
            raise DataFormatError(path, 1, f"the entry {bad[0]!r} in {part!r}", "row indices "
                                  "(integers)", "regenerate with `python -m "
                                  "edbatch.data.generate esol-split`")
    split = {p: [int(i) for i in data[p]] for p in ("train", "valid", "test")}
    if n is not None:
        every = sorted(i for p in split.values() for i in p)
        if every != list(range(n)):
            raise DataFormatError(path, 1, f"{len(every)} indices (some repeated or out of "
                                  f"range)", f"a partition of 0..{n - 1}",
                                  "regenerate with `python -m edbatch.data.generate esol-split`")
    return split
