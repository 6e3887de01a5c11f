"""ED-Batch's exported graph dumps as a workload (``data/graphs/<workload>_B<b>/G<k>.txt``).

The dumps are already condensed typed DAGs (one node per cell or loss, no get nodes), so
there is nothing to choose at emission time: ``granularity`` is validated and ignored. The
vocabulary is abstract: op type ``type<t>`` for every signature id ``t`` of the folder,
``type0`` unbatchable (DyNet's type 0), every other type batchable. A graph built from one
dump keeps the file's node indices as node ids.

Example:
    >>> w = DumpWorkload("mvrnn_B1")
    >>> g = w.instance_graph("all", 0)
    >>> g.num_nodes, w.vocab.names[:3], bool(w.vocab[0].batchable)
    (16, ('type0', 'type1', 'type2'), False)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edbatch.data.dumps import GraphDump, load_dump_folder, save_dump
from edbatch.errors import DataFormatError, GraphError, did_you_mean
from edbatch.graph import Graph, GraphBuilder, OpType, Vocab
from edbatch.workloads.base import Workload

__all__ = ["DumpWorkload", "dump_vocab", "export_dumps", "graph_from_dump"]

_SLICE = re.compile(r"(first|rest):([0-9]+)")


def dump_vocab(num_types: int) -> Vocab:
    """``type0 .. type<T-1>``: abstract variadic ops; ``type0`` is unbatchable."""
    if num_types < 1:
        raise GraphError(f"num_types must be >= 1 (type 0 is the unbatchable type), "
                         f"got {num_types}")
    return Vocab(OpType(f"type{t}", "abstract", None, (), batchable=t != 0)
                 for t in range(num_types))


def _check_types(dump: GraphDump, num_types: int) -> None:
    bad = np.flatnonzero(dump.types >= num_types)
    if len(bad):
        v = int(bad[0])
        raise DataFormatError(  # node v is line v + 2 (after the node count)
            dump.path, v + 2, f"type {int(dump.types[v])} for node {v}",
            f"a type id in 0..{num_types - 1} (the vocabulary has {num_types} op types)",
            f"raise num_types to at least {int(dump.types.max()) + 1}, or pass "
            f"num_types=None to infer it from the folder")


def _sinks(dump: GraphDump) -> np.ndarray:
    return np.flatnonzero(np.bincount(dump.args, minlength=dump.num_nodes) == 0)


def graph_from_dump(dump: GraphDump, vocab: Vocab) -> Graph:
    """Freeze one dump into a :class:`Graph` (vectorized); outputs are its sinks.

    Node ``v`` of the graph is line ``v + 2`` of the file: op id = the dump's type id.

    Raises:
        DataFormatError: a type id does not fit ``vocab`` (names ``file:line`` and node).
    """
    _check_types(dump, len(vocab))
    return Graph.from_arrays(vocab, dump.types, dump.arg_ptr, dump.args, outputs=_sinks(dump))


def export_dumps(graphs: Sequence[Graph], folder: str | Path, *,
                 merge: Sequence[tuple[str, str]] = ()) -> list[Path]:
    """Write ``graphs`` as ED-Batch dumps ``folder/G<k>.txt`` (the format DumpWorkload reads).

    Every batchable op type gets a signature id ``>= 1`` (in vocabulary order, shared by all
    graphs of one vocabulary); unbatchable ones get 0.

    Args:
        graphs: graphs of one vocabulary, written as ``G0``, ``G1``, ...
        folder: the output folder (created).
        merge: ``(regex, name)`` pairs: op types whose name fully matches ``regex`` share the
            signature of ``name``. ED-Batch's lattice dumps, for instance, give the state sums
            of every arity one type: ``[(r".*\\.sum[0-9]+", "sum")]``.

    Raises:
        ValueError: graphs of different vocabularies, or a bad ``merge`` regex.
    """
    if not graphs:
        return []
    vocab = graphs[0].vocab
    if any(g.vocab != vocab for g in graphs):
        raise ValueError("export_dumps needs graphs of one vocabulary (one workload and "
                         "granularity)")
    try:
        rules = [(re.compile(rx), name) for rx, name in merge]
    except re.error as e:
        raise ValueError(f"bad merge regex: {e}") from None
    sig: dict[str, int] = {}
    ids = np.zeros(len(vocab), dtype=np.int64)
    for i, op in enumerate(vocab):
        if op.batchable:
            key = next((name for rx, name in rules if rx.fullmatch(op.name)), op.name)
            ids[i] = sig.setdefault(key, len(sig) + 1)
    return [save_dump(Path(folder) / f"G{k}.txt", ids[g.op_ids], g.operand_ptr, g.operand_ids)
            for k, g in enumerate(graphs)]


def _resolve_folder(folder: str | Path, data_dir: Path) -> Path:
    path = Path(folder)
    if path.is_dir():
        return path
    shipped = data_dir / "graphs" / path
    if not path.is_absolute() and shipped.is_dir():
        return shipped
    known = sorted(p.name for p in (data_dir / "graphs").glob("*") if p.is_dir())
    raise FileNotFoundError(
        f"dump folder {str(folder)!r} not found (also looked in {data_dir / 'graphs'}); "
        f"shipped folders: {known}. Pass a folder of G<k>.txt files"
        + did_you_mean(str(folder), known))


class DumpWorkload(Workload):
    """Every ``G<k>.txt`` of one dump folder, as instances of a workload.

    Splits: ``"all"`` (every dump, ordered by ``k``), ``"train"`` (``G0``, the graph ED-Batch
    trains its FSM on) and ``"test"`` (the others). :meth:`load` also accepts
    ``"first:k"`` / ``"rest:k"`` for the first ``k`` dumps and the remaining ones.

    Args:
        folder: a folder of dumps, or the name of one under ``<data_dir>/graphs``
            (``"mvrnn_B1"``).
        granularity: validated but ignored: dumps are already condensed to cells.
        num_types: vocabulary size ``T``; by default 1 + the largest type id of the folder.
            Fix it to share one vocabulary (and RL action space) across folders.
        data_dir: the data root (defaults to the repository's ``data/``).

    Raises:
        DataFormatError: a dump holds a type id ``>= num_types`` (``file:line``).
        FileNotFoundError: the folder does not exist.
    """

    name = "dumps"
    default_eval_split = "test"  # every dump after G0 (ED-Batch trains on G0)
    granularities = ("cell",)  # the dumps' ops are ED-Batch's; granularity is ignored
    config_defaults: ClassVar[dict[str, Any]] = {
        "folder": "mvrnn_B1",       # a folder under data/graphs, or any path
        "eval": {"batch_size": 1},  # one dump per graph
    }

    def __init__(self, folder: str | Path, granularity: str = "cell",
                 num_types: int | None = None, data_dir: str | Path | None = None) -> None:
        super().__init__(granularity, data_dir)
        self.folder = _resolve_folder(folder, self.data_dir)
        self.dumps: list[GraphDump] = load_dump_folder(self.folder)
        inferred = 1 + max(int(d.types.max()) for d in self.dumps)
        self.num_types = inferred if num_types is None else int(num_types)
        self.vocab = dump_vocab(self.num_types)
        for d in self.dumps:
            _check_types(d, self.num_types)
        self._graphs: dict[str, Graph] = {}

    @property
    def splits(self) -> tuple[str, ...]:
        """``("all", "train", "test")``; see the class docstring for ``first:k``/``rest:k``."""
        return ("all", "train", "test")

    def load(self, split: str) -> Sequence[Any]:
        """The dumps of ``split``; also ``"first:k"`` and ``"rest:k"``."""
        match = _SLICE.fullmatch(split)
        if match is None:
            return super().load(split)
        k = int(match.group(2))
        return self.dumps[:k] if match.group(1) == "first" else self.dumps[k:]

    def _load(self, split: str) -> Sequence[Any]:
        if split == "train":
            return self.dumps[:1]
        return self.dumps[1:] if split == "test" else list(self.dumps)

    def _graph(self, dump: GraphDump) -> Graph:
        graph = self._graphs.get(dump.path)
        if graph is None:
            graph = self._graphs[dump.path] = graph_from_dump(dump, self.vocab)
        return graph

    def instance_graph(self, split: str, index: int) -> Graph:
        """The graph of one dump, built vectorized (node ids = file node indices)."""
        try:
            return self._graph(self.load(split)[index])
        except IndexError:
            raise IndexError(
                f"split {split!r} of {self.folder} has {len(self.load(split))} dumps; "
                f"index {index} is out of range") from None

    def emit(self, instance: Any, builder: GraphBuilder) -> list[int]:
        """Append a dump's nodes to ``builder``; return its sinks (nodes without users)."""
        dump: GraphDump = instance
        _check_types(dump, len(builder.vocab))
        base = len(builder)
        ptr, args = dump.arg_ptr.tolist(), (dump.args + base).tolist()
        for v, t in enumerate(dump.types.tolist()):
            builder.add(t, *args[ptr[v]:ptr[v + 1]])
        return (_sinks(dump) + base).tolist()

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Dump op types read no parameters."""
        return {}

    def graphs(self) -> list[Graph]:
        """The graph of every dump, in file order (``G0``, ``G1``, ...)."""
        return [self._graph(d) for d in self.dumps]

    def protocol_split(self, k: int = 1) -> tuple[list[Graph], list[Graph]]:
        """ED-Batch's protocol: train on the first ``k`` graphs, evaluate on the rest."""
        if not 0 <= k <= len(self.dumps):
            raise GraphError(f"protocol_split needs 0 <= k <= {len(self.dumps)} (the folder "
                             f"has {len(self.dumps)} dumps), got k={k}")
        graphs = self.graphs()
        return graphs[:k], graphs[k:]

    def __repr__(self) -> str:
        return f"DumpWorkload({str(self.folder)!r}, graphs={len(self.dumps)}, ops={self.num_types})"
