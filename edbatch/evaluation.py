"""Scheduler evaluation: one record per (workload, scheduler, graph), and summary tables.

With a cost model (:mod:`edbatch.executor.cost_model`) each record also carries the
schedule's modelled milliseconds, and with a measuring function its measured milliseconds
(the batched executor's median run): the time beside the batch count.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edbatch.graph.ir import Graph
from edbatch.schedule.bounds import lower_bound
from edbatch.schedule.policy import Scheduler
from edbatch.schedule.schedule import Schedule

__all__ = ["Record", "ScheduleTime", "SummaryRow", "evaluate_schedulers", "pivot_table",
           "summarize", "time_table", "write_csv", "write_jsonl"]

#: ``(graph, schedule) -> milliseconds`` (modelled or measured).
ScheduleTime = Callable[[Graph, Schedule], float]


@dataclass(frozen=True, slots=True)
class Record:
    """The outcome of one scheduler on one graph (one JSON line of the results file)."""

    workload: str
    scheduler: str
    graph_id: str
    num_nodes: int
    num_batches: int
    lower_bound: int
    sched_seconds: float
    modelled_ms: float | None = None   # the cost model summed over the schedule's batches
    measured_ms: float | None = None   # the executor's median run of the schedule


@dataclass(frozen=True, slots=True)
class SummaryRow:
    """Aggregate of one (workload, scheduler) over its graphs."""

    workload: str
    scheduler: str
    num_graphs: int
    mean_nodes: float
    mean_batches: float
    max_batches: int
    mean_lower_bound: float
    ratio_to_lb: float
    us_per_node: float
    mean_modelled_ms: float = math.nan
    mean_measured_ms: float = math.nan


def evaluate_schedulers(graphs: Iterable[tuple[str, Graph]],
                        schedulers: Mapping[str, Scheduler], workload: str,
                        *, validate: bool = True, progress: bool = False,
                        modelled: ScheduleTime | None = None,
                        measured: ScheduleTime | None = None) -> list[Record]:
    """Run every scheduler on every graph; validate each schedule; return the records.

    Args:
        graphs: ``(graph_id, graph)`` pairs.
        schedulers: name -> scheduler.
        workload: the workload label written into each record.
        validate: check each schedule against its graph (cheap; on by default).
        progress: show a progress bar over the graphs.
        modelled: ``(graph, schedule) -> ms`` from a cost model, into ``modelled_ms``.
        measured: ``(graph, schedule) -> ms`` by executing it, into ``measured_ms``.
    """
    from tqdm.auto import tqdm

    records = []
    for graph_id, graph in tqdm(graphs, desc=workload, disable=not progress, leave=False):
        lb = lower_bound(graph)
        for name, scheduler in schedulers.items():
            schedule = scheduler(graph)
            if validate:
                schedule.validate(graph)
            records.append(Record(
                workload, name, graph_id, graph.num_nodes, schedule.num_batches, lb,
                schedule.seconds, None if modelled is None else modelled(graph, schedule),
                None if measured is None else measured(graph, schedule)))
    return records


def summarize(records: Sequence[Record]) -> list[SummaryRow]:
    """Mean and max batches, ratio of mean batches to mean LB, scheduling us per node."""
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        groups.setdefault((r.workload, r.scheduler), []).append(r)
    rows = []
    for (workload, scheduler), rs in groups.items():
        mean_b = sum(r.num_batches for r in rs) / len(rs)
        mean_lb = sum(r.lower_bound for r in rs) / len(rs)
        nodes = sum(r.num_nodes for r in rs)
        rows.append(SummaryRow(
            workload, scheduler, len(rs), nodes / len(rs), mean_b,
            max(r.num_batches for r in rs), mean_lb,
            mean_b / mean_lb if mean_lb else math.nan,
            1e6 * sum(r.sched_seconds for r in rs) / max(nodes, 1),
            _mean([r.modelled_ms for r in rs]), _mean([r.measured_ms for r in rs])))
    return rows


def _mean(values: Sequence[float | None]) -> float:
    """Mean of the values, NaN if any is missing (a column not computed)."""
    if not values or any(v is None for v in values):
        return math.nan
    return sum(values) / len(values)  # type: ignore[arg-type]


def write_jsonl(records: Sequence[Any], path: str | Path) -> Path:
    """Append dataclass records as JSON lines (creating parent folders)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(asdict(r)) + "\n")
    return path


def write_csv(rows: Sequence[Any], path: str | Path) -> Path:
    """Write dataclass rows as CSV (header from the first row's fields)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        if rows:
            writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
            writer.writeheader()
            writer.writerows(asdict(r) for r in rows)
    return path


def pivot_table(rows: Sequence[SummaryRow], schedulers: Sequence[str], *,
                title: str = "Mean batches per mini-batch graph (ratio to LB)") -> Any:
    """A ``rich`` table: one row per workload, one column per scheduler, LB first."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("workload")
    table.add_column("graphs", justify="right")
    table.add_column("nodes", justify="right")
    table.add_column("LB", justify="right")
    for name in schedulers:
        table.add_column(name, justify="right")
    by_workload: dict[str, dict[str, SummaryRow]] = {}
    for r in rows:
        by_workload.setdefault(r.workload, {})[r.scheduler] = r
    for workload, cells in by_workload.items():
        first = next(iter(cells.values()))
        best = min(c.mean_batches for c in cells.values())
        out = []
        for name in schedulers:
            c = cells.get(name)
            if c is None:
                out.append("-")
                continue
            text = f"{c.mean_batches:.1f} ({c.ratio_to_lb:.2f})"
            out.append(f"[bold]{text}[/bold]" if c.mean_batches == best else text)
        table.add_row(workload, str(first.num_graphs), f"{first.mean_nodes:.0f}",
                      f"{first.mean_lower_bound:.1f}", *out)
    return table


def time_table(rows: Sequence[SummaryRow], schedulers: Sequence[str]) -> Any:
    """A ``rich`` table of mean batches, modelled ms and measured ms per (workload,
    scheduler); the lowest modelled and measured time of a workload in bold."""
    from rich.table import Table

    table = Table(title="Mean batches, modelled ms, measured ms per mini-batch graph")
    for col in ("workload", "scheduler", "batches", "modelled ms", "measured ms"):
        table.add_column(col, justify="left" if col in ("workload", "scheduler") else "right")
    by_workload: dict[str, dict[str, SummaryRow]] = {}
    for r in rows:
        by_workload.setdefault(r.workload, {})[r.scheduler] = r
    for workload, cells in by_workload.items():
        best = {k: min((getattr(c, k) for c in cells.values() if not math.isnan(getattr(c, k))),
                       default=math.nan) for k in ("mean_modelled_ms", "mean_measured_ms")}

        for name in schedulers:
            c = cells.get(name)
            if c is not None:
                table.add_row(workload, name, f"{c.mean_batches:.1f}",
                              *(_ms(getattr(c, k), best[k]) for k in best))
    return table


def _ms(value: float, best: float) -> str:
    if math.isnan(value):
        return "-"
    return f"[bold]{value:.2f}[/bold]" if value == best else f"{value:.2f}"
