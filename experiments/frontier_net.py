"""The frontier network on lattices: train it, distill it, compare with the heuristics.

``python -m experiments.frontier_net [seed=0] [trainer.rounds=4] [rollout=false] ...``

Trains :mod:`policies.frontier_net` (trainer options: conf/trainer/frontier_net.yaml, given
as ``trainer.<key>=value``) on the main job's lattice training mini-batches (the same split
and graphs as ``experiments.compare``: ``num_train_graphs`` shuffled train mini-batches of
``batch_size`` instances, ``val_from_train`` unshuffled ones for selection), then prints
batches / LB on the main job's test mini-batches for critical path (the best heuristic), the
rollout lookahead over it, the network (numba, per decision) and its FSM distillation (states,
hit rate, gain over its fallback, share of the network's gain kept). Writes the weights
(``frontier_net.npz``) and the FSM (``fsm.json``) into ``out`` (default
``runs/frontier_net/seed<N>``).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from edbatch.errors import EdbatchError
from edbatch.graph import Graph
from edbatch.schedule import lower_bound, make_scheduler, run_policy
from edbatch.workloads import make_workload
from experiments._common import graph_set, seed_everything
from policies.frontier_net import FrontierNetTrainer

CONF = Path(__file__).resolve().parents[1] / "conf"
DEFAULTS = {"seed": 0, "workload": "lattice_lstm", "batch_size": 64, "train_split": "train",
            "num_train_graphs": 16, "val_from_train": 2, "eval_split": "test",
            "eval_limit": 8, "rollout": True, "out": None}


def config(argv: list[str]) -> DictConfig:
    """Defaults, the trainer group's file, then ``key=value`` overrides from ``argv``."""
    cfg = OmegaConf.merge(OmegaConf.create(DEFAULTS),
                          {"trainer": OmegaConf.load(CONF / "trainer" / "frontier_net.yaml")},
                          OmegaConf.from_dotlist(argv))
    unknown = set(cfg) - {*DEFAULTS, "trainer"}
    if unknown:
        raise EdbatchError(f"unknown option(s) {sorted(unknown)}; known: "
                           f"{sorted({*DEFAULTS, 'trainer'})}")
    assert isinstance(cfg, DictConfig)
    return cfg


def _batches(scheduler: Any, graphs: list[Graph]) -> int:
    total = 0
    for g in graphs:
        s = scheduler(g)
        s.validate(g)
        total += s.num_batches
    return total


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train, distill, evaluate; the numbers printed (also returned)."""
    torch.set_num_threads(1)  # small tensors: threads only contend (as experiments.compare)
    seed_everything(int(cfg.seed))
    workload = make_workload(str(cfg.workload))  # the registry (any workload, module_net too)
    bs = int(cfg.batch_size)
    evals = graph_set(workload, cfg.eval_split, bs, cfg.eval_limit)
    val = graph_set(workload, cfg.train_split, bs, cfg.val_from_train)
    train = graph_set(workload, cfg.train_split, bs, cfg.num_train_graphs,
                      shuffle_seed=int(cfg.seed))
    hp = OmegaConf.to_container(cfg.trainer, resolve=False)
    assert isinstance(hp, dict)
    hp.pop("_target_", None)
    hp["seed"] = int(cfg.seed)
    trainer = FrontierNetTrainer(**hp)
    t0 = time.perf_counter()
    result = trainer.fit(train, val)
    train_s = time.perf_counter() - t0
    net, fsm = trainer.net, result.policy
    assert net is not None
    lb = sum(lower_bound(g) for g in evals)
    rows: dict[str, int] = {"critical_path": _batches(make_scheduler("critical_path"), evals)}
    if cfg.rollout:
        rows["rollout"] = _batches(make_scheduler("rollout"), evals)
    rows["frontier_net"] = _batches(net.scheduler(), evals)
    rows["frontier_net_fsm"] = _batches(fsm.scheduler("frontier_net_fsm"), evals)
    fsm.reset_stats()
    for g in evals:
        run_policy(g, fsm)
    cp, nb, fb = rows["critical_path"], rows["frontier_net"], rows["frontier_net_fsm"]
    out = Path(cfg.out or f"runs/frontier_net/seed{cfg.seed}")
    net.save(out / "frontier_net.npz")
    fsm.save(out / "fsm.json")
    stats = {"seed": int(cfg.seed), "lb": lb, "train_seconds": train_s,
             "ratios": {k: v / lb for k, v in rows.items()}, "states": fsm.num_states,
             "encoding": fsm.encoding, "hit_rate": fsm.hit_rate,
             "fallback": fsm.fallback_name,
             "net_gain": 1 - nb / cp, "fsm_gain": 1 - fb / cp,
             "kept": (cp - fb) / (cp - nb) if cp > nb else float("nan"),
             "history": result.history, "out": str(out)}
    _report(stats, rows, len(evals), cfg)
    return stats


def _report(st: dict[str, Any], rows: dict[str, int], n: int, cfg: DictConfig) -> None:
    print(f"workload {cfg.workload}: {n} {cfg.eval_split} mini-batches of {cfg.batch_size}, "
          f"LB {st['lb']} batches in all; seed {st['seed']}; trained on "
          f"{cfg.num_train_graphs} {cfg.train_split} graphs in {st['train_seconds']:.0f} s")
    for h in st["history"]:
        print(f"  DAgger round {h['episode']}: {h['train/samples']} samples, loss "
              f"{h['train/loss']:.3f}, validation {h['eval/ratio_to_lb']:.4f} x LB "
              f"(critical path {h['eval/fallback_ratio_to_lb']:.4f})")
    print(f"{'scheduler':<18}{'batches':>9}{'x LB':>8}")
    for k, v in rows.items():
        print(f"{k:<18}{v:>9}{v / st['lb']:>8.4f}")
    print(f"FSM distillation: key {st['encoding']}, {st['states']} states, hit rate "
          f"{st['hit_rate']:.3f}, fallback {st['fallback']}, gain over critical path "
          f"{100 * st['fsm_gain']:+.2f}%; network's gain {100 * st['net_gain']:+.2f}%; "
          f"share of the network's gain kept: "
          + ("n/a (the network does not beat critical path)" if st["kept"] != st["kept"]
             else f"{100 * st['kept']:.0f}%"))
    print(f"weights: {st['out']}/frontier_net.npz  fsm: {st['out']}/fsm.json")


def main(argv: list[str] | None = None) -> int:
    """Entry point; 0 on success, 2 on a user error (one line on stderr)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        run(config(list(sys.argv[1:] if argv is None else argv)))
    except EdbatchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
