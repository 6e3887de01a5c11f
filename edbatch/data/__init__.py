"""Parsers for the benchmark data in ``data/`` (pure Python + numpy).

Every parser raises :class:`edbatch.errors.DataFormatError` naming ``file:line`` on malformed
input. See ``data/README.md`` for the formats and their origin.
"""

from __future__ import annotations

from edbatch.data.clevr_programs import (
    Metadata,
    ProgramNode,
    Question,
    UndefinedAnswerError,
    execute,
    load_metadata,
    load_questions,
    module_type,
    parse_program,
)
from edbatch.data.clevr_scenes import (
    ClevrObject,
    Properties,
    Scene,
    load_properties,
    load_scenes,
    sample_scene,
    scene_features,
)
from edbatch.data.clevr_templates import load_clevr, load_templates, write_splits
from edbatch.data.dumps import GraphDump, load_dump, load_dump_folder
from edbatch.data.lattices import Lattice, load_lattices
from edbatch.data.molecules import (
    ATOM_FEATURES,
    BOND_TYPES,
    ELEMENTS,
    Molecule,
    load_esol,
    load_esol_split,
    make_esol_split,
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
    "ClevrObject",
    "ELEMENTS",
    "GraphDump",
    "Lattice",
    "Metadata",
    "Molecule",
    "ProgramNode",
    "Properties",
    "Question",
    "Scene",
    "SentencePair",
    "TaggedSentence",
    "Tree",
    "UndefinedAnswerError",
    "execute",
    "load_clevr",
    "load_dump",
    "load_dump_folder",
    "load_esol",
    "load_esol_split",
    "load_lattices",
    "load_metadata",
    "load_pairs",
    "load_properties",
    "load_questions",
    "load_scenes",
    "load_tagged",
    "load_templates",
    "load_trees",
    "load_vocab",
    "make_esol_split",
    "module_type",
    "pair_files",
    "parse_program",
    "parse_smiles",
    "parse_tree",
    "sample_scene",
    "scene_features",
    "wrap_sentence",
    "write_splits",
]
