"""Parsers for the benchmark data in ``data/`` (pure Python + numpy).

Every parser raises :class:`edbatch.errors.DataFormatError` naming ``file:line`` on malformed
input. See ``data/README.md`` for the formats and their origin.
"""

from __future__ import annotations

from edbatch.data.dumps import GraphDump, load_dump, load_dump_folder
from edbatch.data.lattices import Lattice, load_lattices
from edbatch.data.molecules import (
    ATOM_FEATURES,
    BOND_TYPES,
    ELEMENTS,
    Molecule,
    load_esol,
    load_split,
    make_split,
    parse_smiles,
)
from edbatch.data.parallel import (
    SentencePair,
    load_pairs,
    load_vocab,
    pair_files,
    wrap_sentence,
)
from edbatch.data.tags import TaggedSentence, load_tagged
from edbatch.data.trees import Tree, load_trees, parse_tree

__all__ = [
    "ATOM_FEATURES",
    "BOND_TYPES",
    "ELEMENTS",
    "GraphDump",
    "Lattice",
    "Molecule",
    "SentencePair",
    "TaggedSentence",
    "Tree",
    "load_dump",
    "load_dump_folder",
    "load_esol",
    "load_lattices",
    "load_pairs",
    "load_split",
    "load_tagged",
    "load_trees",
    "load_vocab",
    "make_split",
    "pair_files",
    "parse_smiles",
    "parse_tree",
    "wrap_sentence",
]
