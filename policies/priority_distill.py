"""Distilling the priority policy into a :class:`~policies.priority_fsm.PriorityFSM` by DAgger.

The teacher is a trained :class:`~policies.priority.PriorityPolicy`; the student a table over
the rank key (:class:`~policies.priority_fsm.RankKey`: the ready types in critical path's
order, the first few described by a few features cut into classes). DAgger (Ross, Gordon and
Bagnell 2011) with the teacher's labels:

1. round 0: the teacher schedules the labelling graphs; every decision with two or more
   ready types gives ``(key, slot of the teacher's choice)``;
2. the table is the majority slot per key over all data so far (slots the key cannot name,
   a teacher's choice outside the candidates, do not vote; ties go to the lower slot, slot 0
   being critical path's choice);
3. round ``i``: the current table schedules the labelling graphs and the states it visits
   are labelled by the teacher and added (the states the student reaches, not only the
   teacher's);
4. the deployed table is the round's with the fewest batches on the labelling and
   validation graphs together (ties: the earlier round; two validation graphs alone
   select noisily); it is kept only if it needs fewer batches than critical path on the
   labelling graphs and no more on the validation graphs, else the table is empty and the
   metadata says why;
5. optionally (``search_states=N``) a coordinate descent on the batch count itself: for the
   ``N`` keys the table's schedules visit on the most labelling graphs, each other action
   is tried and kept if the graphs visiting that key then need fewer batches; the searched
   table is kept only if it needs no more validation batches. It optimises what the table
   is judged by where the teacher's labels are only a proxy (the table can then need fewer
   batches than its teacher).

The labelling graphs need no batch count from the teacher, only its choices, so they can be
many more than the teacher trained on (``experiments``: the training split's mini-batches).
Deterministic: no sampling anywhere.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edbatch.graph import Graph
from edbatch.schedule import lower_bound
from policies.priority import PriorityPolicy
from policies.priority_fsm import PriorityFSM, RankKey

__all__ = ["DEFAULT_KEYS", "DistillResult", "PriorityDistiller", "PriorityFsmResult",
           "PriorityFsmTrainer", "vote"]

#: The keys tried by default (see docs/learning_alternatives.md): critical path's first 3
#: types with their ``wait_gain`` and ``rel_join`` classes (lattices), and the set of
#: codes of (on the critical path?, ``wait_gain`` low?, ``rel_height`` high?) present
#: (module networks).
DEFAULT_KEYS = (
    RankKey(3, ("wait_gain", "rel_join", "complete", "cp_feed"),
            ((0.069,), (2.0,), (0.5,), (0.13,))),
    RankKey(3, ("wait_gain", "rel_join"), ((0.25,), (0.1, 0.5))),
    RankKey(features=("gap", "wait_gain", "rel_height"), edges=((-0.5,), (0.143,), (0.385,)),
            kind="bucket"),
)

#: Records kept per graph and round (a 64-lattice has about 200 decisions).
RECORD_CAP = 1 << 16


@dataclass
class DistillResult:
    policy: PriorityFSM
    rounds: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0


def vote(key: RankKey, keys: np.ndarray, labels: np.ndarray,
         min_votes: int = 1) -> dict[tuple[int, ...], int]:
    """Majority slot per packed key (votes of slot ``key.slots``, the unrepresentable
    choice, are dropped; ties: the lower slot); keys with fewer than ``min_votes`` votes
    are left out."""
    ok = labels < key.actions
    keys, labels = keys[ok], labels[ok]
    if not len(keys):
        return {}
    pairs, counts = np.unique(np.stack([keys, labels], axis=1), axis=0, return_counts=True)
    table: dict[tuple[int, ...], int] = {}
    best: dict[int, tuple[int, int]] = {}
    total: dict[int, int] = {}
    for (k, a), c in zip(pairs.tolist(), counts.tolist()):
        total[k] = total.get(k, 0) + c
        if k not in best or c > best[k][0]:  # pairs ascend in a: ties keep the lower slot
            best[k] = (c, a)
    for k, (_, a) in best.items():
        if total[k] >= min_votes:
            table[key.unpack(k)] = a
    return table


class PriorityDistiller:
    """DAgger from a priority policy into a rank-key table (module doc).

    Args:
        keys: the candidate keys (:class:`RankKey`; default :data:`DEFAULT_KEYS`): each is
            distilled, the one whose table needs the fewest batches on the labelling and
            validation graphs is kept (ties: the earlier).
        rounds: DAgger rounds after the teacher's own trajectories.
        min_votes: the least votes a key needs to enter the table.
        search_states: keys the final coordinate descent revisits (0: none; module doc).
    """

    name = "priority_fsm"

    def __init__(self, keys: RankKey | Sequence[RankKey] | None = None, rounds: int = 4,
                 min_votes: int = 1, search_states: int = 0) -> None:
        if rounds < 0 or min_votes < 1 or search_states < 0:
            raise ValueError(f"need rounds >= 0, min_votes >= 1 and search_states >= 0, got "
                             f"rounds={rounds}, min_votes={min_votes}, "
                             f"search_states={search_states}")
        self.search_states = search_states
        keys = DEFAULT_KEYS if keys is None else keys
        self.keys = (keys,) if isinstance(keys, RankKey) else tuple(keys)
        if not self.keys:
            raise ValueError("need at least one key")
        self.rounds, self.min_votes = rounds, min_votes

    def fit(self, teacher: PriorityPolicy, label_graphs: Sequence[Graph],
            val_graphs: Sequence[Graph], *, op_types: Sequence[str] | None = None,
            progress: bool = False, metadata: dict[str, Any] | None = None
            ) -> DistillResult:
        """Distil ``teacher`` with every key; keep the best (class doc)."""
        t0 = time.perf_counter()
        results = [self._fit(key, teacher, label_graphs, val_graphs, op_types, progress,
                             metadata) for key in self.keys]
        cost = [r.policy.metadata["label_batches"] + r.policy.metadata["val_batches"]
                for r in results]
        best = results[int(np.argmin(cost))]
        best.policy.metadata["keys_tried"] = [
            {"key": k.to_json(), "label_val_batches": c} for k, c in zip(self.keys, cost)]
        best.policy.metadata["train_seconds"] = round(time.perf_counter() - t0, 3)
        best.seconds = time.perf_counter() - t0
        return best

    def _fit(self, key: RankKey, teacher: PriorityPolicy, label_graphs: Sequence[Graph],
             val_graphs: Sequence[Graph], op_types: Sequence[str] | None, progress: bool,
             metadata: dict[str, Any] | None) -> DistillResult:
        t0 = time.perf_counter()
        names = op_types if key.type_radix else None
        if key.type_radix and names is None:
            names = label_graphs[0].vocab.names
        empty = PriorityFSM(key, {}, names)
        val = list(val_graphs) or list(label_graphs)
        cp_val = sum(len(empty.run(g)[0]) for g in val)
        cp_label = sum(len(empty.run(g)[0]) for g in label_graphs)
        lb_val = max(sum(lower_bound(g) for g in val), 1)
        ks, ls = [], []
        for g in label_graphs:
            rk, rl = empty.run(g, teacher, mode=0, record=RECORD_CAP)[-2:]
            ks.append(rk)
            ls.append(rl)
        rounds: list[dict[str, float]] = []
        tables = []
        for r in range(self.rounds + 1):
            table = vote(key, np.concatenate(ks), np.concatenate(ls), self.min_votes)
            fsm = PriorityFSM(key, table, names)
            train_b = agree = choices = 0
            for g in label_graphs:
                res = fsm.run(g, teacher, mode=1, record=RECORD_CAP)
                train_b += len(res[0])
                choices += int(res[5])
                agree += int(res[6])
                ks.append(res[-2])
                ls.append(res[-1])
            val_b = sum(len(fsm.run(g)[0]) for g in val)
            row = {"round": float(r), "states": float(len(table)),
                   "label_batches": float(train_b), "val_batches": float(val_b),
                   "val_ratio_to_lb": val_b / lb_val, "agreement": agree / max(choices, 1),
                   "records": float(sum(len(k) for k in ks))}
            rounds.append(row)
            tables.append(table)
            if progress:
                print(f"priority_fsm DAgger round {r}: {len(table)} states, label graphs "
                      f"{train_b} batches, validation {val_b} ({val_b / lb_val:.4f} x LB; "
                      f"critical path {cp_val}), agreement {row['agreement']:.3f}", flush=True)
        best = min(range(len(rounds)), key=lambda i: (
            rounds[i]["val_batches"] + rounds[i]["label_batches"], i))
        meta = dict(metadata or {})
        meta.update({"learner": "DAgger from the priority policy", "key": key.to_json(),
                     "rounds": self.rounds,
                     "min_votes": self.min_votes, "round_kept": best,
                     "num_label_graphs": len(label_graphs), "num_val_graphs": len(val),
                     "val_batches": rounds[best]["val_batches"],
                     "val_fallback_batches": cp_val,
                     "label_batches": rounds[best]["label_batches"],
                     "label_fallback_batches": cp_label, "history": rounds,
                     "teacher_metadata": {k: v for k, v in teacher.metadata.items()
                                          if k in ("seed", "workload", "train_batches",
                                                   "train_fallback_batches")}})
        table = tables[best]
        if rounds[best]["val_batches"] > cp_val or rounds[best]["label_batches"] >= cp_label:
            meta["learned_nothing"] = (
                f"the best table needs {rounds[best]['label_batches']:.0f} batches on the "
                f"labelling graphs and {rounds[best]['val_batches']:.0f} on validation, "
                f"critical path {cp_label} and {cp_val}; kept critical path")
            table = {}
            meta["label_batches"], meta["val_batches"] = cp_label, cp_val
        elif self.search_states:
            table, meta["search"] = self._search(key, table, names, label_graphs, val)
            meta["label_batches"] = meta["search"]["label_batches"]
            meta["val_batches"] = meta["search"]["val_batches"]
            if progress:
                print(f"priority_fsm search: {meta['search']}", flush=True)
        meta["train_seconds"] = round(time.perf_counter() - t0, 3)
        return DistillResult(PriorityFSM(key, table, names, meta), rounds,
                             time.perf_counter() - t0)

    def _search(self, key: RankKey, table: dict[tuple[int, ...], int],
                names: Sequence[str] | None, graphs: Sequence[Graph], val: Sequence[Graph]
                ) -> tuple[dict[tuple[int, ...], int], dict[str, float]]:
        """Step 5 of the module doc: ``(table, what the search did)``."""
        def run(tab: dict[tuple[int, ...], int], gs: Sequence[Graph]
                ) -> tuple[list[int], list[set[int]]]:
            fsm = PriorityFSM(key, tab, names)
            res = [fsm.run(g, record=RECORD_CAP) for g in gs]
            return [len(r[0]) for r in res], [set(r[-2].tolist()) for r in res]

        start = dict(table)
        gb, gv = run(table, graphs)
        before = sum(gb)
        visits: dict[int, int] = {}
        for v in gv:
            for k in v:
                visits[k] = visits.get(k, 0) + 1
        order = sorted(visits, key=lambda k: (-visits[k], k))[:self.search_states]
        evals = changed = 0
        for pk in order:
            kt = key.unpack(pk)
            acts = list(kt[1:]) if key.kind == "bucket" else list(range(min(kt[0], key.slots)))
            for a in sorted(set(acts)):
                if a == table.get(kt, None if key.kind == "bucket" else 0):
                    continue
                idx = [i for i, v in enumerate(gv) if pk in v]
                trial = {**table, kt: a}
                nb, nv = run(trial, [graphs[i] for i in idx])
                evals += 1
                if sum(nb) < sum(gb[i] for i in idx):
                    table, changed = trial, changed + 1
                    for i, b, v in zip(idx, nb, nv):
                        gb[i], gv[i] = b, v
        val_start, val_new = (sum(run(t, val)[0]) for t in (start, table))
        kept = val_new <= val_start
        return (table if kept else start), {
            "states": float(len(order)), "evaluations": float(evals), "changed": float(changed),
            "kept": float(kept), "label_batches_before": float(before),
            "label_batches": float(sum(gb) if kept else before),
            "val_batches": float(val_new if kept else val_start)}


@dataclass
class PriorityFsmResult:
    """What :meth:`PriorityFsmTrainer.fit` returns (``experiments.train`` reads it)."""

    policy: PriorityFSM
    best_ratio: float          # validation batches / LB of the deployed table
    episodes: int              # the teacher's schedules (candidates x training graphs)
    seconds: float
    history: list[dict[str, float]] = field(default_factory=list)


class PriorityFsmTrainer:
    """``trainer=priority_fsm``: the priority policy (CEM, :class:`PriorityTrainer`'s
    arguments) trained on the training graphs, then distilled by :class:`PriorityDistiller`
    labelling the same graphs (``benchmarks/priority_distill.py`` labels many more)."""

    name = "priority_fsm"

    def __init__(self, iterations: int = 30, population: int = 32, elite: int = 6,
                 sigma: float = 0.5, sigma_floor: float = 0.05, seed: int = 0,
                 rounds: int = 4, min_votes: int = 1, search_states: int = 0) -> None:
        from policies.priority_train import PriorityTrainer

        self.teacher = PriorityTrainer(iterations, population, elite, sigma, sigma_floor, seed)
        self.distiller = PriorityDistiller(None, rounds, min_votes, search_states)

    def fit(self, train_graphs: Sequence[Graph], val_graphs: Sequence[Graph], *,
            checkpoint: Any = None, progress: bool = False, callback: Any = None,
            metadata: dict[str, Any] | None = None) -> PriorityFsmResult:
        t0 = time.perf_counter()
        res = self.teacher.fit(train_graphs, val_graphs, progress=progress, callback=callback,
                               metadata=metadata)
        fsm = self.distiller.fit(res.policy, train_graphs, val_graphs, progress=progress,
                                 metadata=metadata).policy
        fsm.metadata["teacher_learned"] = res.policy.learned
        val = list(val_graphs) or list(train_graphs)  # (the graphs the distiller validated on)
        lb = max(sum(lower_bound(g) for g in val), 1)
        return PriorityFsmResult(fsm, fsm.metadata["val_batches"] / lb, res.episodes,
                                 time.perf_counter() - t0, res.history)
