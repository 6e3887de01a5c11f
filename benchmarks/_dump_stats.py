"""What the dump protocol (``benchmarks/dump_protocol.py``) reports per seed and overall: the
learned FSM's and the priority policy's states, hit rates and fallback-only ablations on the
test dumps, their path bounds, and the summary rows over seeds."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

__all__ = ["add_priority", "graph_names", "path_bounds", "priority_stats", "summary_rows",
           "table_stats"]


def table_stats(policy_path: Path, folder: Path, k: int, num_types: int | None = None
                ) -> dict[str, Any]:
    """States, hit rate (own decisions, no lookahead) and training time of a trained FSM,
    and the per-graph batches of its fallback alone (same lookahead): the ablation."""
    from edbatch.schedule import run_policy
    from edbatch.workloads.dumps import DumpWorkload
    from policies import FSMPolicy

    wl = DumpWorkload(folder, num_types=num_types)
    dumps = wl.load(f"rest:{k}")
    graphs = [wl.instance_graph(f"rest:{k}", i) for i in range(len(dumps))]
    policy = FSMPolicy.load(policy_path, wl.vocab)
    policy.reset_stats()
    for g in graphs:
        run_policy(g, policy)
    alone = FSMPolicy({}, policy.encoding, policy.op_names, policy.fallback_name,
                      lookahead=policy.lookahead).scheduler("fsm_fallback_only")
    meta = policy.metadata
    return {"states": policy.num_states, "hit_rate": policy.hit_rate,
            "train_seconds": meta.get("train_seconds"),
            "fallback": policy.fallback_name, "lookahead": policy.lookahead,
            "fallback_only": {Path(d.path).name: alone(g).num_batches
                              for d, g in zip(dumps, graphs)}}


def priority_stats(policy_path: Path, folder: Path, k: int, num_types: int | None = None
                   ) -> dict[str, Any]:
    """Learned weights, share of decisions overriding critical path on the test dumps,
    training time, and the per-graph batches of critical path (its fallback)."""
    from edbatch.schedule import make_scheduler
    from edbatch.workloads.dumps import DumpWorkload
    from policies.priority import PriorityPolicy

    wl = DumpWorkload(folder, num_types=num_types)
    dumps = wl.load(f"rest:{k}")
    graphs = [wl.instance_graph(f"rest:{k}", i) for i in range(len(dumps))]
    policy = PriorityPolicy.load(policy_path)
    policy.reset_stats()
    policy.count_hits(graphs)
    cp = make_scheduler("critical_path")
    return {"states": policy.num_states, "hit_rate": policy.hit_rate,
            "train_seconds": policy.metadata.get("train_seconds"),
            "fallback_only": {Path(d.path).name: cp(g).num_batches
                              for d, g in zip(dumps, graphs)}}


def add_priority(path: Path, folder: Path, k: int, num_types: int | None, seed: int,
                 per_seed: dict[str, dict[int, float]]) -> dict[str, Any]:
    """Add critical path's batches as ``priority_fallback_only``; return and print the
    priority policy's stats."""
    stats = priority_stats(path, folder, k, num_types)
    per_seed["priority_fallback_only"][seed] = float(sum(stats.pop("fallback_only").values()))
    print(f"seed {seed}: priority {stats['states']} learned weights, overrides "
          f"{stats['hit_rate']:.3f}, trained in {stats['train_seconds'] or 0:.1f}s", flush=True)
    return stats


def graph_names(folder: Path, k: int) -> list[str]:
    """File names of the test dumps (``rest:k``), in evaluation order."""
    from edbatch.workloads.dumps import DumpWorkload

    return [Path(d.path).name for d in DumpWorkload(folder).load(f"rest:{k}")]


def path_bounds(folder: Path, k: int, names: list[str]) -> dict[str, int]:
    """The path lower bound (:func:`edbatch.schedule.path_bound.path_lower_bound`) of every
    test dump, by file name."""
    from edbatch.schedule.path_bound import path_lower_bound
    from edbatch.workloads.dumps import DumpWorkload

    wl = DumpWorkload(folder)
    return {name: path_lower_bound(wl.instance_graph(f"rest:{k}", i)).bound
            for i, name in enumerate(names)}


def summary_rows(per_seed: dict[str, dict[int, float]], lb: dict[str, int],
                 seed_stats: list[dict[str, Any]], bounds: dict[str, int] | None = None
                 ) -> list[dict[str, Any]]:
    """One row per scheduler: mean (and std over seeds) batches per test graph, ratio to LB
    (and to the path bound, when ``bounds`` are given); the FSM's row adds mean states, hit
    rate and training time over seeds."""
    n, mean_lb = len(lb), sum(lb.values()) / len(lb)
    mean_pb = sum(bounds.values()) / len(bounds) if bounds else None
    rows = []
    for name, by_seed in per_seed.items():
        means = [b / n for b in by_seed.values()]
        m = statistics.fmean(means)
        sd = statistics.stdev(means) if len(means) > 1 else 0.0
        row: dict[str, Any] = {"scheduler": name, "mean_batches": m, "std_over_seeds": sd,
                               "ratio_to_lb": m / mean_lb, "seeds": len(means)}
        if mean_pb:
            row["ratio_to_path_bound"] = m / mean_pb
        stats = ([s["priority"] for s in seed_stats if "priority" in s] if name == "priority"
                 else seed_stats if name == "fsm" else [])
        if stats:
            row["states"] = statistics.fmean(s["states"] for s in stats)
            row["hit_rate"] = statistics.fmean(s["hit_rate"] for s in stats)
            row["train_seconds"] = statistics.fmean(s["train_seconds"] or 0.0 for s in stats)
        rows.append(row)
    return rows
