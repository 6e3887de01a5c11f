"""Main job: train FSMs on real workloads and compare them with the heuristics and LB.

``python -m experiments.compare``: for every workload, ED-Batch's learner (one training graph,
its exact constants) and edbatch's learner (several training graphs, critical-path fallback)
are trained for every seed; both FSMs and the configured heuristics are then evaluated on
unseen evaluation graphs. Prints a table (mean batches and ratio to LB; FSM rows give
mean +- std over seeds, states, hit rate and training time) and writes JSON lines, a CSV and
a PNG.
"""

from __future__ import annotations

import logging
import statistics
from typing import Any

import hydra
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from edbatch.evaluation import (
    Record,
    SummaryRow,
    evaluate_schedulers,
    summarize,
    write_csv,
    write_jsonl,
)
from experiments._cli import guarded
from experiments._common import graph_set, one_workload
from experiments._learned import best_heuristic, learned_nothing, score_unseen, worse_than_best
from experiments._parallel_fit import FitTask, run_fits
from experiments.plots import plot_batches

log = logging.getLogger(__name__)


def compare(cfg: DictConfig) -> tuple[list[Record], list[dict[str, Any]]]:
    """Train, evaluate, and return the evaluation records and per-run training stats.

    The learners of every workload and seed train first, ``cfg.n_jobs`` at a time (one
    process each, seeded per learner: the result does not depend on ``n_jobs``); then every
    FSM is evaluated here on the unseen graphs, in config order."""
    torch.set_num_threads(1)
    heuristics = {name: instantiate(node) for name, node in cfg.scheduler.items()}
    records: list[Record] = []
    runs: list[dict[str, Any]] = []
    per_wl, tasks, keys = [], [], []
    for name, node in cfg.workload.items():
        label, workload, overrides = one_workload({name: node})
        split = cfg.eval_split or overrides.get("split") or workload.default_eval_split
        bs = overrides.get("batch_size", cfg.batch_size)
        eval_graphs = graph_set(workload, split, bs, cfg.eval_limit)
        val = graph_set(workload, cfg.train_split, bs, cfg.val_from_train)
        recs = evaluate_schedulers([(f"{split}/{k}", g) for k, g in enumerate(eval_graphs)],
                                   heuristics, label, progress=True)
        per_wl.append((label, split, eval_graphs, recs))
        for seed in cfg.seeds:
            train = graph_set(workload, cfg.train_split, bs, cfg.num_train_graphs,
                              shuffle_seed=seed)
            for tname, tnode in cfg.trainers.items():
                one = tname in cfg.one_graph_trainers  # ED-Batch's protocol: G0 only
                graphs = train[:1] if one else train
                resolved = OmegaConf.to_container(tnode, resolve=True)
                tasks.append(FitTask(resolved, seed, graphs, graphs if one else val,
                                     {"workload": label, "seed": seed}))
                keys.append((len(per_wl) - 1, seed, tname))
    results = run_fits(tasks, cfg.n_jobs)
    for w, (label, split, eval_graphs, recs) in enumerate(per_wl):
        best, best_b = best_heuristic(recs, list(heuristics))
        for (kw, seed, tname), result in zip(keys, results):
            if kw != w:
                continue
            policy = result.policy
            policy.reset_stats()
            sched = {f"fsm_{tname}": policy.scheduler(f"fsm_{tname}")}
            recs += evaluate_schedulers(
                [(f"{split}/{k}/seed{seed}", g) for k, g in enumerate(eval_graphs)],
                sched, label)
            fsm_b = sum(r.num_batches for r in recs[-len(eval_graphs):])
            # the FSM's own decisions (no lookahead) give its hit rate; its fallback
            # alone (same lookahead, empty table) what the table adds
            u = score_unseen(policy, eval_graphs, fsm_batches=fsm_b)
            runs.append({"workload": label, "trainer": tname, "seed": seed,
                         "episodes": result.episodes, "seconds": result.seconds,
                         "states": u.states, "hit_rate": u.hit_rate,
                         "fallback": u.fallback, "fsm_ratio": u.ratio,
                         "fallback_ratio": u.fallback_ratio, "best": best,
                         "best_ratio": best_b / max(u.lower_bound, 1),
                         "nothing": learned_nothing(f"{label} {tname} seed {seed}", policy,
                                                    u),
                         "worse": worse_than_best(f"{label} {tname} seed {seed}", u, best,
                                                  best_b)})
            log.info("%s %s seed %d: %d episodes, %.1fs, %d states, hit rate %.3f",
                     label, tname, seed, result.episodes, result.seconds,
                     policy.num_states, policy.hit_rate)
        write_jsonl(recs, cfg.results_file)
        records.extend(recs)
    return records, runs


def _seed_spread(records: list[Record]) -> dict[tuple[str, str], str]:
    """'mean +- std' of the batches/LB ratio over seeds, per (workload, FSM)."""
    per: dict[tuple[str, str], dict[str, list[float]]] = {}
    for r in records:
        if r.scheduler.startswith("fsm_"):
            seed = r.graph_id.rsplit("/seed", 1)[1]
            d = per.setdefault((r.workload, r.scheduler), {}).setdefault(seed, [0, 0])
            d[0] += r.num_batches
            d[1] += r.lower_bound
    out = {}
    for key, seeds in per.items():
        ratios = [b / lb for b, lb in seeds.values()]
        std = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
        out[key] = f"{statistics.mean(ratios):.3f} +- {std:.3f} ({len(ratios)} seeds)"
    return out


#: Terminal width of the main job's output.
WIDTH = 100


def _run_header(cfg: DictConfig, rows: list[SummaryRow]) -> str:
    """What was run: data, split, evaluation graphs, batch size, seeds, learners."""
    by_wl: dict[str, SummaryRow] = {}
    for r in rows:
        by_wl.setdefault(r.workload, r)
    data = ", ".join(f"{w} ({r.num_graphs} graphs, ~{r.mean_nodes:.0f} nodes)"
                     for w, r in by_wl.items())
    split = cfg.eval_split or "each workload's default (dev/test)"
    return (f"evaluated on: {data}\n"
            f"split {split}; batch size {cfg.batch_size} instances per mini-batch graph; "
            f"seeds {list(cfg.seeds)}\nlearners {list(cfg.trainers)} trained on "
            f"{cfg.num_train_graphs} {cfg.train_split} graphs "
            f"({', '.join(cfg.one_graph_trainers)}: 1)")


LEGEND = ("LB: lower bound on the batches of a graph (unbatchable nodes + the longest "
          "same-type chain per op type); each cell: mean batches per graph (batches / LB, "
          "1.00 = the bound; bold = fewest). fsm_<learner>: the learned FSM policy. "
          "hit rate: share of the FSM's decisions found in its table (the rest use its "
          "fallback heuristic). Training table: ep episodes, s seconds, fsm/LB the FSM, fb/LB "
          "its fallback alone, gain = 1 - fsm/fb; below it, best/LB of the best single heuristic.")


def scheduler_table(rows: list[SummaryRow], schedulers: list[str]) -> Any:
    """One row per scheduler, one column per workload (fits ``WIDTH`` for any number of
    schedulers): ``mean batches (ratio to LB)``, the fewest in bold; LB first."""
    from rich.table import Table

    workloads = list(dict.fromkeys(r.workload for r in rows))
    cell = {(r.workload, r.scheduler): r for r in rows}
    table = Table(title="Mean batches per mini-batch graph (batches / LB)")
    table.add_column("scheduler")
    for w in workloads:
        table.add_column(w, justify="right")
    lbs = [next((f"{r.mean_lower_bound:.1f}" for r in rows if r.workload == w), "-")
           for w in workloads]
    table.add_row("LB", *lbs, end_section=True)
    best = {w: min((r.mean_batches for r in rows if r.workload == w), default=0.0)
            for w in workloads}
    for name in schedulers:
        out = []
        for w in workloads:
            c = cell.get((w, name))
            text = "-" if c is None else f"{c.mean_batches:.1f} ({c.ratio_to_lb:.2f})"
            out.append(f"[bold]{text}[/bold]" if c and c.mean_batches == best[w] else text)
        table.add_row(name, *out)
    return table


@hydra.main(version_base="1.3", config_path="../conf", config_name="compare")
@guarded
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns edbatch's FSM mean ratio to LB."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    records, runs = compare(cfg)
    rows = summarize(records)
    write_csv(rows, cfg.summary_file)
    names = [*cfg.scheduler, *(f"fsm_{t}" for t in cfg.trainers)]
    plot_batches(rows, cfg.plot_file, names)
    console = Console(width=WIDTH)
    console.print(_run_header(cfg, rows), highlight=False)
    console.print(scheduler_table(rows, names))
    console.print(LEGEND, highlight=False)
    stats = Table(title="FSM training (per seed): what the learned table adds over its "
                  "fallback alone", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  collapse_padding=True)
    for col in ("workload", "trainer", "seed", "ep", "s", "states", "hit", "fallback",
                "fsm/LB", "fb/LB", "gain"):  # ep: episodes, s: seconds, hit: hit rate
        if col == "fallback":  # replay:typewise_greedy_backward folds onto two lines
            stats.add_column(col, justify="right", overflow="fold", max_width=16)
        else:
            stats.add_column(col, justify="right", no_wrap=True)
    for r in runs:
        gain = 1.0 - r["fsm_ratio"] / r["fallback_ratio"] if r["fallback_ratio"] else 0.0
        stats.add_row(r["workload"], r["trainer"], str(r["seed"]), str(r["episodes"]),
                      f"{r['seconds']:.0f}", str(r["states"]), f"{r['hit_rate']:.3f}",
                      r["fallback"], f"{r['fsm_ratio']:.3f}", f"{r['fallback_ratio']:.3f}",
                      f"{100 * gain:+.1f}%")
    console.print(stats)
    worse = [r for r in runs if r["worse"]]
    for r in worse:  # the goal: no learner worse than the best single heuristic
        print(r["worse"])
    if runs:
        bests = ", ".join(sorted({f"{r['workload']} {r['best']} ({r['best_ratio']:.3f} x LB)"
                                  for r in runs}))
        console.print(f"best single heuristic on the unseen graphs: {bests}", highlight=False)
        print(f"never worse than the best single heuristic: {len(runs) - len(worse)} of "
              f"{len(runs)} learner runs")
    for r in runs:  # a learner that learned nothing says so, with the reason
        if r["nothing"]:
            print(r["nothing"])  # one line, never wrapped
    for (workload, fsm), text in _seed_spread(records).items():
        console.print(f"{workload} {fsm}: batches/LB {text}")
    print(f"results: {cfg.results_file}\nsummary: {cfg.summary_file}\nplot: {cfg.plot_file}")
    fsm_ratios = [r.ratio_to_lb for r in rows if r.scheduler == "fsm_fsm"]
    return sum(fsm_ratios) / max(len(fsm_ratios), 1)


if __name__ == "__main__":
    main()
