"""The data side of ``experiments.train_model``: mini-batches (merged, scheduled, planned,
with the tree roots among the graph's outputs), their cache, root scoring and evaluation.

Dev accuracy is computed at the roots: the mini-batch graph's outputs are extended with each
tree's root state (the operand of the instance's last loss node: the workloads emit nodes in
post-order, the root last), and ``logits = W_out h_root + b_out`` is computed from the
workload's parameters. Fine-grained accuracy is the 5-class argmax; binary accuracy drops
neutral roots (label 2) and predicts positive when ``p3 + p4 > p0 + p1``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import NDArray
from torch import Tensor

from edbatch.api._schedulers import fsm_scheduler
from edbatch.errors import ConfigError
from edbatch.executor.auto import AutoBatching, Candidate, make_candidates
from edbatch.executor.distributed import DataParallel
from edbatch.executor.torch_executor import RunResult, TorchExecutor
from edbatch.graph import Graph
from edbatch.memory import MemoryPlan, Strategy, plan_memory
from edbatch.schedule import Schedule, Scheduler, make_scheduler
from edbatch.workloads import Workload

__all__ = ["Built", "Minibatch", "MinibatchCache", "RootScores", "build_minibatch",
           "evaluate", "finish_minibatch", "make_chunks", "make_model_scheduler",
           "merge_scores", "model_candidates", "prepare_minibatch", "root_logits", "root_nodes"]


@dataclass(frozen=True)
class Minibatch:
    """A scheduled, planned mini-batch graph whose outputs are the loss sum, then the roots.

    Attributes:
        graph: the mini-batch graph; ``graph.outputs = [loss_node, *roots]``.
        schedule: its schedule.
        plan: its memory plan.
        loss_node: the ``loss_sum`` node (sum of every tree node's loss).
        roots: ``int32[T]`` root state node of each tree.
        labels: ``int64[T]`` root label of each tree.
        num_tree_nodes: labelled tree nodes (loss terms) in the mini-batch.
        candidate: the label of the scheduler and strategy that made ``schedule``, ``plan``.
    """

    graph: Graph
    schedule: Schedule
    plan: MemoryPlan
    loss_node: int
    roots: NDArray[np.int32]
    labels: NDArray[np.int64]
    num_tree_nodes: int
    candidate: str = ""


@dataclass
class RootScores:
    """Running counts of root predictions and of the loss."""

    fine: int = 0
    binary: int = 0
    binary_total: int = 0
    trees: int = 0
    loss: float = 0.0
    tree_nodes: int = 0

    def add(self, logits: Tensor, labels: Tensor, loss: float, tree_nodes: int) -> None:
        """Count one mini-batch's root predictions (``logits [T, 5]``, ``labels [T]``)."""
        probs = logits.detach().cpu().softmax(dim=1)  # scored on the host, any device
        self.fine += int((probs.argmax(dim=1) == labels).sum())
        polar = labels != 2
        positive = probs[:, 3:].sum(dim=1) > probs[:, :2].sum(dim=1)
        self.binary += int((positive == (labels > 2))[polar].sum())
        self.binary_total += int(polar.sum())
        self.trees += len(labels)
        self.loss += loss
        self.tree_nodes += tree_nodes

    def reduced(self, dp: DataParallel) -> RootScores:
        """These counts summed over the data-parallel ranks (``self`` for one process)."""
        if not dp.enabled:
            return self
        fine, binary, total, trees, loss, nodes = dp.sum(
            [self.fine, self.binary, self.binary_total, self.trees, self.loss, self.tree_nodes])
        return RootScores(int(fine), int(binary), int(total), int(trees), loss, int(nodes))

    def metrics(self, stage: str) -> dict[str, float]:
        """``<stage>/fine_accuracy``, ``binary_accuracy``, ``loss`` (per tree node)."""
        return {f"{stage}/fine_accuracy": self.fine / max(self.trees, 1),
                f"{stage}/binary_accuracy": self.binary / max(self.binary_total, 1),
                f"{stage}/loss": self.loss / max(self.tree_nodes, 1),
                f"{stage}/num_trees": float(self.trees)}


def root_nodes(graph: Graph, loss_op: int) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
    """Each instance's root state node and root label.

    The root's loss is the last loss node of its instance (post-order emission); its single
    operand is the root state and its attr the root label.
    """
    losses = np.flatnonzero(graph.op_ids == loss_op)
    last = np.full(graph.num_instances, -1, dtype=np.int64)
    np.maximum.at(last, graph.instance[losses], losses)
    roots = graph.operand_ids[graph.operand_ptr[last]]
    return roots.astype(np.int32), graph.attrs[last].astype(np.int64)


@dataclass(frozen=True)
class Built:
    """A mini-batch's construction, shared by every scheduler and memory strategy:
    ``merged`` is the merged graph (scheduled: the schedulers reuse its parts' caches),
    ``graph`` the same nodes with the roots among its outputs (planned and run)."""

    merged: Graph
    graph: Graph
    loss_node: int
    roots: NDArray[np.int32]
    labels: NDArray[np.int64]
    num_tree_nodes: int


def build_minibatch(workload: Workload, split: str, indices: Sequence[int]) -> Built:
    """Merge one mini-batch; add the root states to the graph's outputs."""
    merged = workload.minibatch(split, indices)
    loss_op = merged.vocab.id(f"{workload.name}.loss")
    roots, labels = root_nodes(merged, loss_op)
    loss_node = int(merged.outputs[0])
    graph = Graph.from_arrays(merged.vocab, merged.op_ids, merged.operand_ptr,
                              merged.operand_ids, attrs=merged.attrs, instance=merged.instance,
                              outputs=np.concatenate([[loss_node], roots]), depth=merged.depth,
                              validate=False)
    return Built(merged, graph, loss_node, roots, labels, int(merged.type_counts[loss_op]))


def finish_minibatch(built: Built, scheduler: Scheduler, strategy: str,
                     label: str = "") -> Minibatch:
    """Schedule and plan a built mini-batch (``label``: the candidate that did it)."""
    schedule = scheduler(built.merged)
    plan = plan_memory(built.graph, schedule, cast(Strategy, strategy))
    return Minibatch(built.graph, schedule, plan, built.loss_node, built.roots, built.labels,
                     built.num_tree_nodes, label)


def prepare_minibatch(workload: Workload, split: str, indices: Sequence[int],
                      scheduler: Scheduler, strategy: str) -> Minibatch:
    """Merge, schedule and plan one mini-batch; add the root states to the graph's outputs."""
    return finish_minibatch(build_minibatch(workload, split, indices), scheduler, strategy)


def root_logits(result: RunResult, batch: Minibatch, params: Mapping[str, Tensor],
                prefix: str) -> Tensor:
    """``W_out h_root + b_out`` for every tree of the mini-batch, ``[T, classes]``."""
    weight, bias = params[f"{prefix}.W_out"], params[f"{prefix}.W_out.b"]
    states = torch.cat([result.outputs[int(v)] for v in batch.roots])
    return F.linear(states[:, :weight.shape[1]], weight, bias)


class MinibatchCache:
    """Mini-batches of one split, built on first use and kept, scheduled and planned by
    the candidate asked for (the ``auto`` chooser's leader by default; a mini-batch made
    by another candidate is scheduled and planned again, its construction reused)."""

    def __init__(self, workload: Workload, split: str, chunks: list[list[int]],
                 auto: AutoBatching) -> None:
        self.workload, self.split, self.chunks, self.auto = workload, split, chunks, auto
        self._built: dict[int, Built] = {}
        self._done: dict[int, Minibatch] = {}

    def __len__(self) -> int:
        return len(self.chunks)

    def built(self, k: int) -> Built | None:
        """Mini-batch ``k``'s construction (made now if it is the first use); ``None`` if
        chunk ``k`` is empty (a rank's share of a global mini-batch smaller than the world)."""
        if not self.chunks[k]:
            return None
        if k not in self._built:
            self._built[k] = build_minibatch(self.workload, self.split, self.chunks[k])
        return self._built[k]

    def get(self, k: int, candidate: Candidate | None = None) -> Minibatch | None:
        """Mini-batch ``k`` scheduled and planned by ``candidate`` (default: the chooser's
        leader); ``None`` if chunk ``k`` is empty."""
        built = self.built(k)
        if built is None:
            return None
        candidate = candidate or self.auto.leader()
        done = self._done.get(k)
        if done is None or done.candidate != candidate.label:
            done = self._done[k] = finish_minibatch(built, candidate.scheduler,
                                                    candidate.strategy, candidate.label)
        return done

    def __iter__(self) -> Iterator[Minibatch]:
        return (mb for mb in map(self.get, range(len(self))) if mb is not None)


def make_chunks(num: int, limit: int | None, batch_size: int, seed: int | None) -> list[list[int]]:
    """Consecutive chunks of the first ``limit`` instances, seeded-shuffled if ``seed``."""
    order = np.arange(num if limit is None else min(limit, num))
    if seed is not None:
        np.random.default_rng(seed).shuffle(order)
    return [sorted(order[i:i + batch_size].tolist()) for i in range(0, len(order), batch_size)]


def make_model_scheduler(name: str, fsm: str | None, lookahead: str = "none") -> Scheduler:
    """A heuristic by registry name, or the FSM artifact at ``fsm`` when given: its run-time
    path (one table lookup per decision) for ``lookahead="none"``, the lookahead saved in
    the artifact (rollout: fewer batches, far slower scheduling) for ``"artifact"``."""
    if not fsm:
        return make_scheduler(name)
    from policies import FSMScheduler

    artifact = FSMScheduler(fsm)  # loads the policy; checks each graph's op types
    if lookahead == "artifact":
        return artifact
    # the run-time path, with the same op-type check (a PolicyFileError naming the file)
    return fsm_scheduler(artifact.policy, runtime=True, path=artifact.path)


def model_candidates(batching: str, fsm: str | None, strategy: str,
                     auto: Mapping[str, Any], lookahead: str = "none") -> list[Candidate]:
    """What ``batching`` may run: one candidate (the FSM when given, else the heuristic,
    with ``strategy``), or for ``batching="auto"`` the ``auto`` schedulers (the FSM first,
    when given) crossed with the ``auto`` memory strategies."""
    if batching == "fsm" and not fsm:
        raise ConfigError("fsm", fsm, "the path of a trained FSM artifact with batching=fsm",
                          "pass fsm=runs/<workload>/<trainer>/seed<N>/policy.json, or "
                          "another batching")
    if batching != "auto":
        sched = make_model_scheduler(batching, fsm, lookahead)
        return [Candidate(f"{'fsm' if fsm else batching}/{strategy}", sched,
                          cast(Strategy, strategy))]
    policy = make_model_scheduler("", fsm, lookahead) if fsm else None
    return make_candidates(auto["schedulers"], auto["strategies"], policy)


def evaluate(executor: TorchExecutor, params: Mapping[str, Tensor], batches: MinibatchCache,
             prefix: str, dp: DataParallel | None = None) -> dict[str, float]:
    """Root accuracies and the per-node loss over every mini-batch (no grad, in place);
    with ``dp``, over every rank's mini-batches."""
    scores = RootScores()
    with torch.no_grad():
        for mb in batches:
            res = executor.run(mb.graph, mb.schedule, mb.plan, params, grad=False)
            scores.add(root_logits(res, mb, params, prefix), torch.from_numpy(mb.labels),
                       float(res.outputs[mb.loss_node].sum()), mb.num_tree_nodes)
    return (scores if dp is None else scores.reduced(dp)).metrics("eval")


def merge_scores(into: RootScores, part: RootScores) -> None:
    for name in ("fine", "binary", "binary_total", "trees", "tree_nodes"):
        setattr(into, name, getattr(into, name) + getattr(part, name))
    into.loss += part.loss

