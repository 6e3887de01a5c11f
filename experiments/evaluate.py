"""Compare schedulers on workloads: ``python -m experiments.evaluate [overrides]``.

Prints a table (mean and max batches, ratio to LB, scheduling time per node) and writes one
JSON line per (workload, scheduler, graph) plus a CSV summary into the run's output folder.
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
    evaluate_schedulers,
    pivot_table,
    summarize,
    write_csv,
    write_jsonl,
)
from edbatch.graph import Graph
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
        recs = evaluate_schedulers(_graphs(workload, split, batch_size, cfg.limit),
                                   schedulers, label, progress=cfg.progress)
        write_jsonl(recs, cfg.results_file)  # per workload, so a crash loses nothing done
        records.extend(recs)
    return records


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
@guarded
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the mean ratio to LB of the first scheduler."""
    from rich.console import Console

    log.debug("config:\n%s", OmegaConf.to_yaml(cfg))
    records = evaluate(cfg)
    rows = summarize(records)
    write_csv(rows, cfg.summary_file)
    Console(width=200).print(pivot_table(rows, list(cfg.scheduler)))
    print(f"results: {cfg.results_file}\nsummary: {cfg.summary_file}")
    first = [r.ratio_to_lb for r in rows if r.scheduler == next(iter(cfg.scheduler))]
    return sum(first) / max(len(first), 1)


if __name__ == "__main__":
    main()
