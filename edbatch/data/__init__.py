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
from edbatch.data.sick import DepTree, SickPair, load_sick, similarity_target
from edbatch.data.tags import TaggedSentence, load_tagged
from edbatch.data.transitions import (
    ArcStandardState,
    crossing_arcs,
    is_projective,
    labelled_oracle,
    oracle,
    projective_only,
    replay,
)
from edbatch.data.trees import SST_LABELS, Tree, load_trees, parse_tree
from edbatch.data.ud import UPOS_TAGS, DepSentence, Treebank, find_cycle, load_conllu
from edbatch.data.vocab import CharVocab, FrequentWords, word_counts

__all__ = [
    "ATOM_FEATURES",
    "BOND_TYPES",
    "ELEMENTS",
    "SST_LABELS",
    "UPOS_TAGS",
    "ArcStandardState",
    "CharVocab",
    "ClevrObject",
    "DepSentence",
    "DepTree",
    "FrequentWords",
    "GraphDump",
    "Lattice",
    "Metadata",
    "Molecule",
    "ProgramNode",
    "Properties",
    "Question",
    "Scene",
    "SentencePair",
    "SickPair",
    "TaggedSentence",
    "Tree",
    "Treebank",
    "UndefinedAnswerError",
    "crossing_arcs",
    "execute",
    "find_cycle",
    "is_projective",
    "labelled_oracle",
    "load_clevr",
    "load_conllu",
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
    "load_sick",
    "load_tagged",
    "load_templates",
    "load_trees",
    "load_vocab",
    "make_esol_split",
    "module_type",
    "oracle",
    "pair_files",
    "parse_program",
    "parse_smiles",
    "parse_tree",
    "projective_only",
    "replay",
    "sample_scene",
    "scene_features",
    "similarity_target",
    "word_counts",
    "wrap_sentence",
    "write_splits",
]
