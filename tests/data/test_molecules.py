"""Tests of edbatch.data.molecules: the real ESOL file, its split, and every malformed case."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from edbatch.data import (
    BOND_TYPES,
    ELEMENTS,
    load_esol,
    load_esol_split,
    make_esol_split,
    parse_smiles,
)
from edbatch.data.generate import main
from edbatch.errors import DataFormatError

DATA = Path(__file__).resolve().parents[2] / "data" / "esol"
HEADER = "Compound ID,Minimum Degree,measured log solubility in mols per litre,smiles\n"


def test_real_file() -> None:
    mols = load_esol(DATA / "delaney-processed.csv")
    assert len(mols) == 1128
    ys = np.array([m.y for m in mols])
    assert ys.min() == pytest.approx(-11.6) and ys.max() == pytest.approx(1.58)
    assert ys.mean() == pytest.approx(-3.05, abs=0.01)
    assert mols[0].name == "Amigdalin" and mols[0].y == pytest.approx(-0.77)
    assert sum(m.n_atoms for m in mols) == 14991
    assert sum(m.n_bonds for m in mols) == 15428
    kinds = Counter(BOND_TYPES[t] for m in mols for t in m.bond_types)
    assert kinds == {"single": 2 * 8255, "aromatic": 2 * 6041, "double": 2 * 1091,
                     "triple": 2 * 41}
    elements = Counter(ELEMENTS[e] for m in mols for e in m.atoms[:, 0])
    assert elements["C"] == 11207 and elements["Cl"] == 645 and elements["I"] == 18
    for m in mols:  # every bond in both directions, atom indices in range
        assert m.edges.shape == (2 * m.n_bonds, 2)
        assert np.array_equal(m.edges[0::2], m.edges[1::2][:, ::-1])
        assert m.edges.size == 0 or m.edges.max() < m.n_atoms
        deg = np.bincount(m.edges[:, 0], minlength=m.n_atoms)
        assert np.array_equal(deg, m.atoms[:, 1])


def test_benzene_features() -> None:
    atoms, edges, types = parse_smiles("c1ccccc1O")
    assert atoms.shape == (7, 6)
    assert list(atoms[0]) == [ELEMENTS.index("C"), 2, 0, 1, 1, 1]
    assert list(atoms[6]) == [ELEMENTS.index("O"), 1, 0, 0, 1, 0]
    assert list(atoms[5]) == [0, 3, 0, 1, 0, 1]
    assert len(edges) == 14 and Counter(types.tolist()) == {3: 12, 0: 2}
    atoms, _, types = parse_smiles("C#N.[NH4+]")
    assert list(types) == [2, 2] and atoms[2, 2] == 1 and atoms[2, 4] == 4


def test_stored_split_is_the_seeded_one() -> None:
    split = load_esol_split(DATA / "split.json", n=1128)
    assert split == make_esol_split(1128, seed=0)
    assert [len(split[p]) for p in ("train", "valid", "test")] == [902, 113, 113]
    assert json.loads((DATA / "split.json").read_text())["seed"] == 0
    assert make_esol_split(1128, seed=1) != split


def test_split_file_regenerates_bit_for_bit(tmp_path: Path) -> None:
    main(["esol-split", "--out", str(tmp_path / "split.json")])
    assert (tmp_path / "split.json").read_bytes() == (DATA / "split.json").read_bytes()


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "esol.csv"
    path.write_text(HEADER + body, encoding="utf-8")
    return path


def test_small_file_and_quoted_names(tmp_path: Path) -> None:
    path = _write(tmp_path, '"1,2-dichloro",1,-1.5,ClCCCl\nwater,0,0.5, O \n\n')
    a, b = load_esol(path)
    assert (a.name, a.y, a.n_atoms, b.smiles, b.n_atoms) == ("1,2-dichloro", -1.5, 4, "O", 1)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("ok,1,-1.0,CCO\nbad,1,-2.0,C1CC(\n",
         "esol.csv:3: found malformed SMILES 'C1CC('"),
        ("ok,1,-1.0,CCO\nsalt,1,-2.0,[Na+].[Cl-]\n",
         "esol.csv:3: found element 'Na' in SMILES '[Na+].[Cl-]'; expected an element of the "
         "vocabulary C, N, O, S, F, Cl, Br, I, P, B, Si, Se"),
        ("a,1,abc,CCO\n", "esol.csv:2: found solubility 'abc'; expected a finite number"),
        ("a,1,,CCO\n", "esol.csv:2: found an empty solubility"),
        ("a,1,nan,CCO\n", "esol.csv:2: found solubility 'nan'"),
        ("a,1,-1.0\n", "esol.csv:2: found 3 fields; expected 4 fields"),
        ('"two\nlines",1,-1.0,CCO\nb,1,x,C\n', "esol.csv:4: found solubility 'x'"),
    ],
)
def test_bad_rows(tmp_path: Path, body: str, needle: str) -> None:
    with pytest.raises(DataFormatError) as err:
        load_esol(_write(tmp_path, body))
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_header_and_split(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_text("name,smiles\nx,C\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"h.csv:1: .*'measured log solubility"):
        load_esol(path)
    split = tmp_path / "s.json"
    split.write_text('{"train": [0, 1], "valid": [1], "test": []}', encoding="utf-8")
    with pytest.raises(DataFormatError, match="a partition of 0..2"):
        load_esol_split(split, n=3)
    split.write_text('{"train": [0, 1], "test": [2]}', encoding="utf-8")
    with pytest.raises(DataFormatError, match="a list 'valid'"):
        load_esol_split(split)
