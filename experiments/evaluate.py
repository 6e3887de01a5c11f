"""Compare schedulers on workloads: ``python -m experiments.evaluate [overrides]``.

Prints a table (mean and max batches, ratio to LB, scheduling time per node) and writes one
JSON line per (workload, scheduler, graph) plus a CSV summary into the run's output folder.

``cost_model=calibrate`` (or the path of a file from ``experiments.calibrate``) adds each
schedule's modelled milliseconds, ``measure_reps=N`` its measured milliseconds (median of N
runs of the batched executor on ``device``), and a second table of both beside the batches.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from edbatch.errors import UnknownNameError
from edbatch.evaluation import (
    Record,
    ScheduleTime,
    evaluate_schedulers,
    pivot_table,
    summarize,
    time_table,
    write_csv,
    write_jsonl,
)
from edbatch.graph import Graph
from edbatch.schedule import Schedule
from edbatch.workloads import Workload
from experiments._cli import guarded

log = logging.getLogger(__name__)


def _graphs(workload: Workload, split: str, batch_size: int, limit: int | None
            ) -> Iterator[tuple[str, Graph]]:
    for k, graph in enumerate(workload.batches(split, batch_size, limit=limit)):
        yield f"{split}/{k}", graph


def _workloads(cfg: DictConfig) -> Iterator[tuple[str, Workload, dict[str, Any]]]:
    """Instantiate every selected workload at every requested granularity.

    A workload config may hold an ``eval`` node (``split``, ``batch_size``) with its own
    evaluation defaults; it is not passed to the constructor.
    """
    for name, node in (cfg.workload or {}).items():
        node = OmegaConf.to_container(node, resolve=True)
        assert isinstance(node, dict)
        overrides = node.pop("eval", None) or {}
        grans = cfg.granularities if "granularity" in node else [None]
        for gran in grans:
            kwargs: dict[str, Any] = {} if gran is None else {"granularity": gran}
            label = name if gran is None else f"{name}/{gran}"
            yield label, instantiate(node, **kwargs), overrides


def evaluate(cfg: DictConfig) -> list[Record]:
    """Run the configured schedulers on the configured workloads; return all records."""
    schedulers = {name: instantiate(node) for name, node in (cfg.scheduler or {}).items()}
    if not schedulers:
        raise UnknownNameError("no scheduler selected; pass e.g. scheduler=[depth,dynet_agenda]")
    records: list[Record] = []
    for label, workload, overrides in _workloads(cfg):
        split = cfg.split or overrides.get("split") or workload.default_eval_split
        batch_size = overrides.get("batch_size", cfg.batch_size)
        log.info("evaluating %s on %s split %r", list(schedulers), label, split)
        graphs = list(_graphs(workload, split, batch_size, cfg.limit))
        modelled, measured = _timers(cfg, label, workload, [g for _, g in graphs])
        recs = evaluate_schedulers(graphs, schedulers, label, progress=cfg.progress,
                                   modelled=modelled, measured=measured)
        write_jsonl(recs, cfg.results_file)  # per workload, so a crash loses nothing done
        records.extend(recs)
    return records


def _timers(cfg: DictConfig, label: str, workload: Workload, graphs: list[Graph]
            ) -> tuple[ScheduleTime | None, ScheduleTime | None]:
    """The modelled-ms and measured-ms functions of one workload, as configured."""
    if not cfg.cost_model and not cfg.measure_reps:
        return None, None
    import torch

    from edbatch.executor import init_params
    from edbatch.executor.cost_model import measure_schedule_ms
    from experiments.calibrate import resolve_cost_model

    torch.set_num_threads(1)
    modelled = measured = None
    model = resolve_cost_model(cfg.cost_model, workload, graphs,
                               f"{cfg.output_dir}/cost_model/{label.replace('/', '_')}.json",
                               device=cfg.device)
    if model is not None:
        vocab = workload.vocab

        def modelled(graph: Graph, schedule: Schedule) -> float:
            return model.schedule_ms(schedule, vocab)
    if cfg.measure_reps:
        params = init_params(workload, torch.Generator().manual_seed(cfg.seed),
                             device=cfg.device)

        def measured(graph: Graph, schedule: Schedule) -> float:
            return measure_schedule_ms(graph, schedule, params, reps=cfg.measure_reps,
                                       device=cfg.device)
    return modelled, measured


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
@guarded
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the mean ratio to LB of the first scheduler."""
    from rich.console import Console

    log.debug("config:\n%s", OmegaConf.to_yaml(cfg))
    records = evaluate(cfg)
    rows = summarize(records)
    write_csv(rows, cfg.summary_file)
    console = Console(width=200)
    console.print(pivot_table(rows, list(cfg.scheduler)))
    if cfg.cost_model or cfg.measure_reps:
        console.print(time_table(rows, list(cfg.scheduler)))
    print(f"results: {cfg.results_file}\nsummary: {cfg.summary_file}")
    first = [r.ratio_to_lb for r in rows if r.scheduler == next(iter(cfg.scheduler))]
    return sum(first) / max(len(first), 1)


if __name__ == "__main__":
    main()
