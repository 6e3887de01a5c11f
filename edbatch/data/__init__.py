"""Parsers for the benchmark data in ``data/`` (pure Python + numpy).

Every parser raises :class:`edbatch.errors.DataFormatError` naming ``file:line`` on malformed
input. See ``data/README.md`` for the formats and their origin.
"""

from __future__ import annotations

from edbatch.data.dumps import GraphDump, load_dump, load_dump_folder
from edbatch.data.lattices import Lattice, load_lattices
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
    "SST_LABELS",
    "UPOS_TAGS",
    "ArcStandardState",
    "CharVocab",
    "DepSentence",
    "DepTree",
    "FrequentWords",
    "GraphDump",
    "Lattice",
    "SentencePair",
    "SickPair",
    "TaggedSentence",
    "Tree",
    "Treebank",
    "crossing_arcs",
    "find_cycle",
    "is_projective",
    "labelled_oracle",
    "load_conllu",
    "load_dump",
    "load_dump_folder",
    "load_lattices",
    "load_pairs",
    "load_sick",
    "load_tagged",
    "load_trees",
    "load_vocab",
    "oracle",
    "pair_files",
    "parse_tree",
    "projective_only",
    "replay",
    "similarity_target",
    "word_counts",
    "wrap_sentence",
]
