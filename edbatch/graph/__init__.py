"""Graph IR: op types, vocabularies, the frozen Graph, its builder, merging and CSE."""

from edbatch.graph.builder import GraphBuilder
from edbatch.graph.cse import dedupe_leaves
from edbatch.graph.ir import COMPLEX_KINDS, Graph, Node, OpType, Shape, Vocab
from edbatch.graph.merge import merge_graphs

__all__ = ["COMPLEX_KINDS", "Graph", "GraphBuilder", "Node", "OpType", "Shape", "Vocab",
           "dedupe_leaves", "merge_graphs"]
