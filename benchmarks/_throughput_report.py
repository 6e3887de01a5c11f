"""Rows of ``benchmarks/throughput.py``: DyNet worker reports as rows, the loss check, the
terminal table and the bar chart.

A row is a dict with ``workload, size, mode, contender, framework, batches, *_ms, total_ms,
items_per_s, overhead_share`` and, for some contenders, ``gathers`` (a count), ``gather_ms``
(from a profiled pass), ``scale`` (> 1 when the contender ran on fewer mini-batches than the
others: its ms are shown scaled to the full set) and ``loss_match`` (DyNet rows).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["RATIO_REFERENCES", "UNBATCHED", "add_ratios", "check_losses", "dynet_rows", "plot_rows",
           "print_table", "ratio_reference"]

#: Contenders the speed ratio is taken against, first one present wins.
RATIO_REFERENCES = ("dynet_autobatch1", "dynet_agenda")

_COLUMNS = (("contender", 18), ("b/mb", 6), ("constr", 7), ("sch+pln", 7), ("exec", 7),
            ("bwd+upd", 7), ("total", 7), ("ovh%", 4), ("items/s", 7), ("xDyN", 5),
            ("xunb", 5), ("xflr", 5), ("MB", 5), ("loss", 4))
#: The contender ``ratio_to_dynet_agenda`` divides by.
DYNET_AGENDA = "dynet_autobatch1"
#: The contender ``ratio_to_unbatched`` divides by: per-instance PyTorch, node by node.
UNBATCHED = "pytorch_unbatched"


def add_ratios(rows: Sequence[dict[str, Any]]) -> None:
    """Set ``ratio_to_dynet_agenda`` (items/s over DyNet agenda's, ``None`` without it),
    ``ratio_to_unbatched`` (items/s over per-instance PyTorch's, ``pytorch_unbatched``, the
    seeds' baseline; ``None`` without it) and ``floor_multiple`` (total ms over the ``floor``
    row's) on every row, per workload x size x mode."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["workload"], row["size"], row["mode"]), []).append(row)
    for group in groups.values():
        ref = next((r for r in group if r["contender"] == DYNET_AGENDA), None)
        floor = next((r for r in group if r["contender"] == "floor"), None)
        unb = next((r for r in group if r["contender"] == UNBATCHED), None)
        for row in group:
            row["ratio_to_dynet_agenda"] = (row["items_per_s"] / ref["items_per_s"]
                                            if ref else None)
            row["ratio_to_unbatched"] = (row["items_per_s"] / unb["items_per_s"]
                                         if unb else None)
            row["floor_multiple"] = (row["total_ms"] * row.get("scale", 1.0)
                                     / floor["total_ms"] if floor else None)


def dynet_rows(report: dict[str, Any], modes: Sequence[str], **base: Any
               ) -> list[dict[str, Any]]:
    """Rows (one per mode) from a ``dynet_peer.py`` JSON report; ``base`` keys go first.

    DyNet's ``forward`` (autobatch scheduling, gathers and kernels) is the ``execution``
    phase; it has no separate scheduling or planning phase.
    """
    rows = []
    for mode in modes:
        r = report[mode]
        ms = {"construction_ms": r["construction_ms"], "scheduling_ms": 0.0,
              "planning_ms": 0.0, "execution_ms": r["forward_ms"],
              "backward_ms": r.get("backward_ms", 0.0), "update_ms": r.get("update_ms", 0.0)}
        rows.append({**base, "mode": mode, "contender": report["contender"],
                     "framework": "dynet", "minibatches": len(report["losses"]),
                     "items": report["items"], "scale": 1.0, **ms, "total_ms": r["total_ms"],
                     "items_per_s": r["items_per_s"],
                     "overhead_share": r["construction_ms"] / r["total_ms"],
                     "loss": report["losses"][0], "losses": report["losses"]})
    return rows


def check_losses(rows: Sequence[dict[str, Any]], rtol: float = 1e-3) -> None:
    """Set ``loss_match`` on every row but the reference and the floor: its per-mini-batch
    losses against those of the edbatch row with the most mini-batches (all within relative
    tolerance ``rtol``), on the same mini-batches."""
    ref = max((r for r in rows if r["framework"] == "edbatch"), default=None,
              key=lambda r: len(r["losses"]))
    for row in rows:
        if row is ref or row["framework"] == "floor" or ref is None:
            continue
        errs = [abs(a - b) / max(abs(a), abs(b), 1e-12)
                for a, b in zip(row["losses"], ref["losses"])]
        row["loss_max_rel_err"] = max(errs, default=math.nan)
        row["loss_match"] = bool(errs) and max(errs) <= rtol
        row["loss_reference"] = ref["contender"]


def ratio_reference(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The row the ``x ref`` column divides by (DyNet agenda, else edbatch's agenda)."""
    for name in RATIO_REFERENCES:
        for row in rows:
            if row["contender"] == name:
                return row
    return None


def _cells(row: dict[str, Any], ref: dict[str, Any] | None) -> list[str]:
    scale = row.get("scale", 1.0)
    edbatch = row["framework"] == "edbatch"

    def ms(*keys: str, na: bool = False) -> str:
        return "-" if na else f"{sum(row[k] for k in keys) * scale:.1f}"

    train = row["mode"] == "train"
    ratio = f"{row['items_per_s'] / ref['items_per_s']:.2f}" if ref else "-"
    unb = row.get("ratio_to_unbatched")
    xunb = "-" if not unb else f"{unb:.2f}" if unb < 10 else f"{unb:.1f}" if unb < 100 else \
        f"{unb:.0f}"
    fm = row.get("floor_multiple")
    floor = "-" if not fm else f"{fm:.2f}" if fm < 10 else f"{fm:.1f}" if fm < 100 else \
        f"{fm:.0f}"
    loss = {True: "ok", False: "DIFF"}.get(row.get("loss_match"), "")  # type: ignore[arg-type]
    batches = f"{row['batches']:.1f}" if "batches" in row else "-"
    rss = row.get("peak_rss_mb")
    return [row["contender"] + ("*" if scale != 1.0 else ""), batches, ms("construction_ms"),
            ms("scheduling_ms", "planning_ms", na=not edbatch), ms("execution_ms"),
            ms("backward_ms", "update_ms", na=not train), ms("total_ms"),
            f"{100 * row['overhead_share']:.0f}", f"{row['items_per_s']:.0f}", ratio, xunb, floor,
            "-" if rss is None or math.isnan(rss) else f"{rss:.0f}", loss]


def print_table(rows: Sequence[dict[str, Any]]) -> None:
    """Print one workload x size x mode block (rows share those three keys)."""
    if not rows:
        return
    first, ref = rows[0], ratio_reference(rows)
    items = max(r["items"] for r in rows)
    print(f"\n{first['workload']} {first['size']} {first['mode']}, "
          f"{first.get('data', 'repeated')} mini-batches: {items} instances per pass "
          f"({max(r['minibatches'] for r in rows)} of 64); xDyN = items/s / "
          f"{ref['contender'] if ref else '-'}; xunb = items/s / {UNBATCHED}; "
          f"xflr = total / floor")
    header = " ".join(f"{name:>{w}}" if i else f"{name:<{w}}"
                      for i, (name, w) in enumerate(_COLUMNS))
    print(header + "\n" + "-" * len(header))
    for row in rows:
        cells = _cells(row, ref)
        print(" ".join(f"{c:>{w}}" if i else f"{c:<{w}}"
                       for i, (c, (_, w)) in enumerate(zip(cells, _COLUMNS))))
    notes = []
    scaled = [r for r in rows if r.get("scale", 1.0) != 1.0]
    for r in scaled:
        notes.append(f"* {r['contender']}: timed on the first {r['minibatches']} mini-batch(es) "
                     f"({r['items']} instances); ms scaled x{r['scale']:.2f} to the full set, "
                     f"items/s (and xunb) as measured")
    fsm = next((r for r in rows if r["contender"] == "fsm"), None)
    if fsm is not None and fsm.get("ratio_to_unbatched"):
        notes.append(f"fsm: {fsm['ratio_to_unbatched']:.1f}x the items/s of {UNBATCHED} "
                     f"(per-instance PyTorch, node by node, the seeds' baseline)")
    if any(r["framework"] == "dynet" for r in rows):
        notes.append("DyNet: exec = forward (its autobatch scheduling, gathers and kernels); "
                     "loss = per-mini-batch losses vs edbatch (rel tol 1e-3)")
        runs = [f"{r['contender']} " + " / ".join(f"{v:.0f}" for v in r["items_per_s_runs"])
                for r in rows if len(r.get("items_per_s_runs", ())) > 1]
        if runs:
            notes.append("DyNet items/s per run (before / after the edbatch passes; the "
                         "faster is shown): " + ", ".join(runs))
    notes.append("ms summed over the mini-batches of a pass (medians over passes); ovh% = "
                 "(construction + scheduling + planning) / total; MB = peak RSS growth in "
                 "one pass on mini-batch 0 (DyNet: the same mini-batch in fresh workers "
                 "with growable forward and smallest sufficient backward pools, "
                 "benchmarks/_dynet_memory.py); loss = losses vs the edbatch reference "
                 "(rel tol 1e-3)")
    print("\n".join(notes), flush=True)


def plot_rows(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Bar chart: one panel per workload x mode, items/s per contender grouped by size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    contenders = list(dict.fromkeys(r["contender"] for r in rows))
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    fig, axes = plt.subplots(max(len(workloads), 1), max(len(modes), 1), squeeze=False,
                             figsize=(5.5 * max(len(modes), 1), 3.6 * max(len(workloads), 1)))
    width = 0.8 / max(len(contenders), 1)
    colors = plt.get_cmap("tab20")
    for i, wl in enumerate(workloads):
        for j, mode in enumerate(modes):
            ax = axes[i][j]
            for k, c in enumerate(contenders):
                vals = [next((r["items_per_s"] for r in rows if r["workload"] == wl
                              and r["mode"] == mode and r["contender"] == c
                              and r["size"] == s), math.nan) for s in sizes]
                xs = [x + (k - (len(contenders) - 1) / 2) * width for x in range(len(sizes))]
                dynet = c.startswith("dynet_autobatch")
                ax.bar(xs, vals, width, label=c, color=colors(k % 20),
                       hatch="//" if dynet else None, edgecolor="white" if dynet else None)
            ax.set_xticks(range(len(sizes)), sizes)
            ax.set_yscale("log")
            low = [r["items_per_s"] for r in rows if r["workload"] == wl and r["mode"] == mode
                   and r["items_per_s"] > 0]
            if low:
                ax.set_ylim(bottom=min(low) / 2)
            ax.set_title(f"{wl} / {mode}")
            ax.set_ylabel("items/s (log)")
            ax.grid(axis="y", alpha=0.3, which="both")
    if rows:
        axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    data = ", ".join(dict.fromkeys(str(r.get("data", "repeated")) for r in rows))
    fig.suptitle(f"edbatch vs DyNet vs hand-batched PyTorch ({data} mini-batches of 64, "
                 f"1 CPU thread)")
    fig.tight_layout()
    from experiments.plots import save_figure

    return save_figure(fig, path)
