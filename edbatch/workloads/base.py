"""The Workload contract, the mini-batch graph builder and the graph sampler.

A workload owns its dataset reader, its op vocabulary (at one of two granularities) and
the emission of one instance's nodes. Everything downstream (schedulers, the env, the
executor) only sees graphs over ``workload.vocab``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from edbatch.errors import GraphError, UnknownNameError, did_you_mean, is_integer
from edbatch.graph import Graph, GraphBuilder, OpType, Vocab, merge_graphs
from edbatch.graph.merge import PackedGraphs
from edbatch.workloads.primitives import OpSet

__all__ = [
    "DATA_DIR",
    "LOSS_SUM",
    "REGISTRY",
    "Granularity",
    "GraphSampler",
    "Workload",
    "check_granularity",
    "loss_sum_op",
]

#: The data shipped with the repository (see data/README.md for provenance and licenses).
DATA_DIR = Path(__file__).resolve().parents[2] / "data"

Granularity = Literal["cell", "primitive"]

#: Name of the unbatchable variadic op that sums the per-instance losses of a mini-batch.
LOSS_SUM = "loss_sum"


def check_granularity(granularity: str) -> Granularity:
    """Validate a granularity name."""
    if granularity not in ("cell", "primitive"):
        raise UnknownNameError(
            f"unknown granularity {granularity!r}; expected 'cell' (one op type per cell, "
            f"like ED-Batch's blocks) or 'primitive' (matmul, add, tanh ... as DyNet sees them)"
            + did_you_mean(granularity, ["cell", "primitive"]))
    return granularity  # type: ignore[return-value]


#: Registry: workload name -> class. Defining a subclass that sets its own ``name`` adds it
#: (:meth:`Workload.__init_subclass__`); ``edbatch.workloads`` imports the shipped modules.
REGISTRY: dict[str, type[Workload]] = {}


class Workload(abc.ABC):
    """A dynamic-NN workload over a real data set.

    Subclasses set :attr:`name`, build :attr:`vocab` in ``__init__`` and implement
    :meth:`load`, :meth:`emit` and :meth:`param_shapes`. A subclass that sets its own
    ``name`` is registered on definition: ``make_workload(name)``, the entry points'
    ``workload=name`` config (generated from the constructor's signature), the test suite
    and the benchmarks find it there.

    Attributes:
        name: registry name, e.g. ``"tree_lstm"``.
        granularity: ``"cell"`` or ``"primitive"``.
        vocab: the op types every graph of this workload uses (ids are RL actions).
    """

    name: ClassVar[str] = ""
    #: The split the evaluation entry point uses unless told otherwise.
    default_eval_split: ClassVar[str] = "dev"
    #: The split a policy trainer validates on unless told (``experiments.train val_split``).
    default_val_split: ClassVar[str] = "dev"
    #: A model over a real data set: the test suite runs every such workload (REAL_WORKLOADS).
    real_data: ClassVar[bool] = False
    #: The granularities whose graphs differ; with one, the generated config has no
    #: ``granularity`` key and ``experiments.evaluate`` runs the workload once.
    granularities: ClassVar[tuple[str, ...]] = ("cell", "primitive")
    #: Config values other than the constructor's defaults; an ``eval`` node holds
    #: evaluation defaults (``split``, ``batch_size``), not constructor arguments.
    config_defaults: ClassVar[Mapping[str, Any]] = {}
    #: Every cell-granularity kind has a hand-written backward (the tests check the executor
    #: runs them and that they equal autograd).
    hand_backward: ClassVar[bool] = False
    granularity: Granularity
    vocab: Vocab

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if not name:
            return  # a shared base (TreeWorkload...) or a subclass keeping its parent's name
        old = REGISTRY.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (
                cls.__module__, cls.__qualname__):
            raise UnknownNameError(
                f"workload name {name!r} of {cls.__module__}.{cls.__qualname__} is taken by "
                f"{old.__module__}.{old.__qualname__}; give the new class another name")
        REGISTRY[name] = cls

    @classmethod
    def test_kwargs(cls, dim: int = 8, hidden: int | None = None, *, short: bool = False
                    ) -> dict[str, Any]:
        """Constructor keywords of a small instance for fast tests.

        ``dim``-wide embeddings and ``hidden``-wide states (default ``dim``) where the
        workload has them; ``short`` also shrinks what makes its data large (vocabularies,
        sentence lengths). The test suite builds every workload through this.
        """
        return {}

    def __init__(self, granularity: str = "cell", data_dir: str | Path | None = None) -> None:
        self.granularity = check_granularity(granularity)
        self.data_dir = Path(data_dir) if data_dir is not None else DATA_DIR
        self._cache: dict[tuple[str, int], Graph] = {}
        self._built: dict[str, int] = {}  # graphs built per split (cleared caches: more)
        self._packed: dict[str, PackedGraphs] = {}  # a split's cached graphs, packed
        self._splits: dict[str, Sequence[Any]] = {}

    # ------------------------------------------------------------------ subclass API
    @property
    @abc.abstractmethod
    def splits(self) -> tuple[str, ...]:
        """Names of the available splits, e.g. ``("train", "dev", "test")``."""

    @abc.abstractmethod
    def _load(self, split: str) -> Sequence[Any]:
        """Read one split from disk (called once per split, then cached)."""

    @abc.abstractmethod
    def emit(self, instance: Any, builder: GraphBuilder) -> list[int]:
        """Append one instance's nodes to ``builder``; return its output (loss) node ids."""

    @abc.abstractmethod
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of every parameter named in the vocabulary's ``OpType.params``."""

    def _declare_cells(self, ops: OpSet) -> Any:
        """Declare the cell-granularity op types (override in workloads that use
        :meth:`_declare_vocab`)."""
        raise NotImplementedError

    def _declare_primitives(self, ops: OpSet) -> Any:
        """Declare the primitive-granularity op types (see :meth:`_declare_cells`)."""
        raise NotImplementedError

    def _declare_vocab(self) -> Any:
        """Declare the granularity's op types plus the final loss sum.

        Sets :attr:`vocab` and the parameter shapes; returns what the declaring hook
        returned (e.g. the cell op names).
        """
        ops = OpSet()
        hook = self._declare_cells if self.granularity == "cell" else self._declare_primitives
        declared = hook(ops)
        ops.add(loss_sum_op())
        self.vocab = ops.vocab()
        self._params: dict[str, tuple[int, ...]] = dict(ops.params)
        return declared

    # ------------------------------------------------------------------ shared machinery
    def load(self, split: str) -> Sequence[Any]:
        """The instances of ``split`` (cached)."""
        if split not in self.splits:
            raise UnknownNameError(
                f"workload {self.name!r} has no split {split!r}; available: "
                f"{list(self.splits)}." + did_you_mean(split, self.splits))
        if split not in self._splits:
            self._splits[split] = self._load(split)
        return self._splits[split]

    def instance_graph(self, split: str, index: int) -> Graph:
        """The graph of one instance (cached; merging cached graphs is cheap)."""
        key = (split, index)
        graph = self._cache.get(key)
        if graph is None:
            builder = GraphBuilder(self.vocab)
            outputs = self.emit(self.load(split)[index], builder)
            graph = self._cache[key] = builder.build(outputs)
            self._built[split] = self._built.get(split, 0) + 1
        return graph

    def build_graph(self, instances: Sequence[Any], *, loss_sum: bool = True) -> Graph:
        """Build the mini-batch graph of ``instances`` directly with one builder.

        With ``loss_sum`` a final unbatchable node sums every instance's outputs, as the
        single loss node of a DyNet mini-batch graph does.
        """
        builder = GraphBuilder(self.vocab)
        outputs: list[int] = []
        for i, inst in enumerate(instances):
            builder.instance = i
            outputs.extend(self.emit(inst, builder))
        if loss_sum and LOSS_SUM in self.vocab:
            builder.instance = 0
            outputs = [builder.add(LOSS_SUM, *outputs)]
        return builder.build(outputs)

    def minibatch(self, split: str, indices: Sequence[int], *, loss_sum: bool = True) -> Graph:
        """Merge the cached instance graphs of ``indices`` into one mini-batch graph.

        Once every instance graph of ``split`` is cached (as the trainers build them), they
        are packed once (:class:`~edbatch.graph.merge.PackedGraphs`) and a mini-batch is a
        few gathers from the pack: the graph :func:`~edbatch.graph.merge.merge_graphs`
        makes, faster (0.16 -> 0.08 ms for 64 CLEVR questions); a pack whose graphs are no
        longer the cached ones (a cleared cache) is dropped."""
        idx = [int(i) for i in indices]
        graphs = [self.instance_graph(split, i) for i in idx]
        reduce = LOSS_SUM if loss_sum and LOSS_SUM in self.vocab else None
        packed = self._packed_for(split, graphs, idx)
        if packed is not None:
            return packed.merge(idx, reduce_op=reduce)
        return merge_graphs(graphs, reduce_op=reduce)

    def _packed_for(self, split: str, graphs: list[Graph], idx: list[int]
                    ) -> PackedGraphs | None:
        """The pack of ``split`` if it holds ``graphs`` at ``idx`` (made if every graph of
        the split is cached), else ``None``."""
        packed = self._packed.get(split)
        if not graphs or min(idx) < 0:  # (a negative index is cached as its own graph)
            return None
        if packed is not None:
            held = packed.graphs
            if all(held[i] is g for i, g in zip(idx, graphs)):
                return packed
            del self._packed[split]  # the cache was cleared: its graphs are other objects
        n = len(self.load(split))
        if self._built.get(split, 0) < n:
            return None
        every = [self._cache.get((split, i)) for i in range(n)]
        if any(g is None for g in every):  # (built before a cache was cleared)
            self._built[split] = n - every.count(None)
            return None
        self._packed[split] = packed = PackedGraphs(every)  # type: ignore[arg-type]
        return packed if all(packed.graphs[i] is g for i, g in zip(idx, graphs)) else None

    def batches(self, split: str, batch_size: int, *, limit: int | None = None
                ) -> Iterator[Graph]:
        """Consecutive mini-batch graphs over ``split`` (the last one may be smaller)."""
        check_batch_size(batch_size)
        n = len(self.load(split))
        for k, start in enumerate(range(0, n, batch_size)):
            if limit is not None and k >= limit:
                return
            yield self.minibatch(split, range(start, min(n, start + batch_size)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(granularity={self.granularity!r}, ops={len(self.vocab)})"


def check_batch_size(batch_size: Any) -> None:
    """Refuse a ``batch_size`` that is not an integer >= 1 (a bool, float or string too).

    Raises:
        GraphError: naming the value, its type and the fix.
    """
    if not is_integer(batch_size) or batch_size < 1:
        raise GraphError(f"batch_size must be an integer >= 1, got {batch_size!r} "
                         f"({type(batch_size).__name__}); pass e.g. batch_size=64")


class GraphSampler:
    """Samples mini-batch graphs of one workload split with a caller-supplied generator.

    Both the environment and the trainers draw graphs through this, so they see the same
    distribution.

    Args:
        workload: the workload.
        split: which split to sample from.
        batch_size: instances per mini-batch graph.
    """

    def __init__(self, workload: Workload, split: str, batch_size: int) -> None:
        check_batch_size(batch_size)
        self.workload, self.split, self.batch_size = workload, split, int(batch_size)
        self.num_instances = len(workload.load(split))

    @property
    def vocab(self) -> Vocab:
        """The workload's vocabulary."""
        return self.workload.vocab

    def __call__(self, rng: np.random.Generator) -> Graph:
        """Draw ``batch_size`` instances without replacement and merge their graphs."""
        size = min(self.batch_size, self.num_instances)
        idx = rng.choice(self.num_instances, size=size, replace=False)
        return self.workload.minibatch(self.split, np.sort(idx).tolist())


def loss_sum_op(out_shape: tuple[int, ...] = (1,)) -> OpType:
    """The unbatchable variadic op that sums every loss of a mini-batch (DyNet's final sum)."""
    return OpType(LOSS_SUM, "sum", None, out_shape, batchable=False)
