"""Graph IR: op types, vocabularies, the frozen Graph, its builder and merging."""

from edbatch.graph.builder import GraphBuilder
from edbatch.graph.ir import COMPLEX_KINDS, Graph, Node, OpType, Shape, Vocab
from edbatch.graph.merge import merge_graphs

__all__ = ["COMPLEX_KINDS", "Graph", "GraphBuilder", "Node", "OpType", "Shape", "Vocab",
           "merge_graphs"]
