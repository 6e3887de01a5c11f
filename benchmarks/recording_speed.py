"""Recording cost per node through the public API, with the user's own model code.

Records 64-instance mini-batches of the training split with per-instance code written as a
user writes it and times the recording alone (``time.process_time``, which a loaded
machine inflates much less than wall time), in microseconds per recorded graph node, the
end of each mini-batch (``discard``) included:

* ``tree_lstm``, ``bilstm_tagger``, ``lattice_lstm``: the workloads' built-in fused cells
  (``DynamicBatch.from_workload`` + ``batch.op``), the recorders of
  :mod:`benchmarks.models_api`;
* ``tree_cells``: a binary Tree-LSTM of user-registered ``nn.Module`` cells on the same SST
  trees, as in ``examples/custom_tree_rnn.py`` (``batch.lookup`` of an embedding, a
  composition cell, a loss cell with ``attr=label``, ``add_loss`` at every node);
* ``childsum_cells``: the same trees with one variadic child-sum cell
  (``variadic=True``, ``cell(x, *children)``).

``--baseline DIR`` also loads ``DIR/edbatch/api`` (e.g. ``git archive <commit> edbatch/api |
tar -x -C DIR``) next to this checkout's and interleaves them, round by round, in the same
process (the layers below the API are this checkout's for both); the table gives each one's
median and the ratio baseline / current. ``--assemble`` times each mini-batch's graph
assembly (``batch.graph()``) too, as the throughput benchmark's construction column does.
``--breakdown`` (this checkout's API only) splits each node's time into recording, assembly
and the end of the mini-batch, beside the *user floor*: the same user code on a
:class:`StubBatch` whose ops and cells return one constant and record nothing (the
``with batch.instance()`` blocks stay real), i.e. what the model code costs before any
recorder runs. It asserts nothing.

    python benchmarks/recording_speed.py [--models tree_lstm tree_cells] [--rounds 7] \\
        [--baseline /tmp/api_base] [--assemble] [--breakdown]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import Tensor, nn

from benchmarks import _args
from benchmarks.models_api import RECORDERS
from edbatch.executor import init_params
from edbatch.workloads import make_workload

__all__ = ["MODELS", "StubBatch", "load_api", "main", "time_breakdown", "time_recording"]

#: model name -> workload whose training split it records.
MODELS = {"tree_lstm": "tree_lstm", "bilstm_tagger": "bilstm_tagger",
          "lattice_lstm": "lattice_lstm", "tree_cells": "tree_lstm",
          "childsum_cells": "tree_lstm"}


class _Compose(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(2 * dim, dim)

    def forward(self, left: Tensor, right: Tensor) -> Tensor:
        return torch.tanh(self.linear(torch.cat([left, right], dim=1)))


class _ChildSum(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(2 * dim, dim)

    def forward(self, x: Tensor, rows: Tensor, segment: Tensor, size: int) -> Tensor:
        h = rows.new_zeros((size, rows.shape[1])).index_add(0, segment, rows)
        return torch.tanh(self.linear(torch.cat([x, h], dim=1)))


class _Loss(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 5)

    def forward(self, h: Tensor, labels: Tensor) -> Tensor:
        return nn.functional.cross_entropy(self.linear(h), labels, reduction="none")


def _tree_cells(api: ModuleType, wl: Any, dim: int, variadic: bool
                ) -> tuple[Any, Callable[[Sequence[Any]], None]]:
    """A user's Tree-RNN on ``api.DynamicBatch`` and its per-tree recorder."""
    batch = api.DynamicBatch()
    embed = nn.Embedding(len(wl.word_vocab) + 1, dim)
    lookup, add_loss, word_id = batch.lookup, batch.add_loss, wl.word_vocab.id
    loss = batch.cell(_Loss(dim), "loss", [dim], (), takes_attr=True)
    if variadic:
        node_cell = batch.cell(_ChildSum(dim), "node", [dim, dim], dim, variadic=True)

        def encode(node: Any) -> Any:
            kids = node.children
            x = lookup(embed, word_id(node.word) if not kids else 0)
            h = node_cell(x, *[encode(k) for k in kids])
            add_loss(loss(h, attr=node.label))
            return h
    else:
        compose = batch.cell(_Compose(dim), "compose", [dim, dim], dim)

        def encode(node: Any) -> Any:
            kids = node.children
            if not kids:
                h = lookup(embed, word_id(node.word))
            else:
                h = compose(*[encode(k) for k in kids])
            add_loss(loss(h, attr=node.label))
            return h

    def record(instances: Sequence[Any]) -> None:
        for inst in instances:
            with batch.instance():
                encode(inst.tree)
    return batch, record


def make_recorder(api: ModuleType, model: str, wl: Any, dim: int
                  ) -> tuple[Any, Callable[[Sequence[Any]], None]]:
    """``(batch, record)`` of ``model`` on the API module ``api``."""
    if model in RECORDERS:
        params = init_params(wl, torch.Generator().manual_seed(0))
        batch = api.DynamicBatch.from_workload(wl, params)
        return batch, lambda instances: RECORDERS[model](batch, wl, instances)
    return _tree_cells(api, wl, dim, variadic=model == "childsum_cells")


def time_recording(batch: Any, record: Callable[[Sequence[Any]], None],
                   minibatches: Sequence[Sequence[Any]], assemble: bool = False
                   ) -> tuple[float, int]:
    """CPU seconds recording ``minibatches`` and discarding each (the end of a mini-batch
    is part of recording's cost) and the nodes recorded; ``assemble``: each mini-batch's
    graph is built too (``batch.graph()``, as the throughput benchmark's construction)."""
    total, nodes = 0.0, 0
    for mb in minibatches:
        t0 = time.process_time()
        record(mb)
        n = len(batch._rec.ops)
        if assemble:
            batch.graph()
        batch.discard()  # timed too: ending a mini-batch recycles its handles
        total += time.process_time() - t0
        nodes += n
    return total, nodes


class StubBatch:
    """A stand-in for a ``DynamicBatch`` whose ops, cells and lookups return one constant
    and record nothing, and whose ``add_loss`` does nothing: the user code's own cost.
    ``instance()`` is the real batch's (so each instance's block costs what it does)."""

    def __init__(self, batch: Any) -> None:
        self.batch, self.value = batch, object()

        def const(*operands: Any, attr: int = -1) -> Any:
            return self.value
        self.const = const

    def op(self, name: str) -> Callable[..., Any]:
        return self.const

    def cell(self, *args: Any, **kw: Any) -> Callable[..., Any]:
        return self.const

    def lookup(self, embedding: Any, index: int) -> Any:
        return self.value

    def add_loss(self, handle: Any) -> None:
        pass

    def instance(self) -> Any:
        return self.batch.instance()


def time_breakdown(model: str, wl: Any, dim: int, minibatches: Sequence[Sequence[Any]]
                   ) -> dict[str, float]:
    """CPU seconds of ``model`` on this checkout's API over ``minibatches``, by phase:
    ``record``, ``assemble`` (``batch.graph()``), ``end`` (``discard``), and ``floor``:
    the same user code on a :class:`StubBatch`; also ``nodes``, the nodes recorded."""
    import edbatch.api as api

    batch, record = make_recorder(api, model, wl, dim)
    stub = StubBatch(batch)
    if model in RECORDERS:
        def floor(mb: Sequence[Any]) -> None:
            RECORDERS[model](stub, wl, mb)  # type: ignore[arg-type]
    else:
        stub_api = SimpleNamespace(DynamicBatch=lambda: stub)
        floor = _tree_cells(stub_api, wl, dim, variadic=model == "childsum_cells")[1]  # type: ignore[arg-type]
    out = dict.fromkeys(("record", "assemble", "end", "floor", "nodes"), 0.0)
    clock = time.process_time
    for mb in minibatches:
        t0 = clock()
        record(mb)
        t1 = clock()
        out["nodes"] += len(batch._rec.ops)
        batch.graph()
        t2 = clock()
        batch.discard()
        t3 = clock()
        floor(mb)
        t4 = clock()
        batch.discard()  # (the stub's instance marks)
        for key, sec in (("record", t1 - t0), ("assemble", t2 - t1), ("end", t3 - t2),
                         ("floor", t4 - t3)):
            out[key] += sec
    return out


def load_api(root: Path) -> ModuleType:
    """``root/edbatch/api`` imported as a second copy of ``edbatch.api`` (the modules
    below it shared); this checkout's ``edbatch.api`` stays in place."""
    if not (root / "edbatch" / "api" / "__init__.py").is_file():
        raise SystemExit(f"--baseline {root}: found no edbatch/api there")
    import edbatch.api  # this checkout's first

    mine = {k: v for k, v in sys.modules.items() if k.startswith("edbatch.api")}
    path = list(edbatch.__path__)
    try:
        for k in mine:
            del sys.modules[k]
        edbatch.__path__[:] = [str(root / "edbatch")]
        other = importlib.import_module("edbatch.api")
        theirs = {k: v for k, v in sys.modules.items() if k.startswith("edbatch.api")}
    finally:
        edbatch.__path__[:] = path
        for k in [k for k in sys.modules if k.startswith("edbatch.api")]:
            del sys.modules[k]
        sys.modules.update(mine)
        edbatch.api = mine["edbatch.api"]  # type: ignore[attr-defined]
    if other.__file__ is None or not other.__file__.startswith(str(root)):
        raise SystemExit(f"--baseline {root}: found no edbatch/api there")
    del theirs
    return other


def main(argv: Sequence[str] | None = None) -> None:
    """Parse arguments, time the recorders (interleaved with ``--baseline``), print a table."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--minibatches", type=int, default=4, help="64-instance mini-batches")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--dim", type=int, default=8, help="cell width of the user-cell models")
    p.add_argument("--assemble", action="store_true",
                   help="time each mini-batch's graph assembly (batch.graph()) too")
    p.add_argument("--breakdown", action="store_true",
                   help="this checkout only: us per node by phase beside the user floor")
    p.add_argument("--baseline", type=Path, default=None,
                   help="a directory holding another edbatch/api to compare with")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    import edbatch.api as current

    apis = {"current": current}
    if args.baseline is not None:
        apis = {"baseline": load_api(args.baseline), "current": current}
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    if args.breakdown:
        return _breakdown(args, load)
    print(f"load average at start: {' '.join(load)}; CPU us per recorded node"
          f"{' (graph assembly included)' if args.assemble else ''}, median of "
          f"{args.rounds} rounds of {args.minibatches} mini-batches of 64")
    workloads: dict[str, Any] = {}
    print(f"{'model':<16}{'nodes/mb':>9}" + "".join(f"{k:>10}" for k in apis)
          + ("   ratio" if len(apis) > 1 else ""))
    for model in args.models:
        name = MODELS[model]
        if name not in workloads:
            wl = make_workload(name, embed_dim=8, hidden_dim=8)
            workloads[name] = (wl, wl.load("train"))
        wl, data = workloads[name]
        mbs = [list(data[k * 64:(k + 1) * 64]) for k in range(args.minibatches)]
        made = {k: make_recorder(api, model, wl, args.dim) for k, api in apis.items()}
        for batch, record in made.values():
            time_recording(batch, record, mbs[:1])  # warm up
        per: dict[str, list[float]] = {k: [] for k in apis}
        nodes = 0
        for r in range(args.rounds):
            keys = list(apis) if r % 2 == 0 else list(apis)[::-1]
            for k in keys:
                sec, nodes = time_recording(*made[k], mbs, args.assemble)
                per[k].append(1e6 * sec / nodes)
        med = {k: statistics.median(v) for k, v in per.items()}
        ratio = f"{med['baseline'] / med['current']:>8.2f}" if len(apis) > 1 else ""
        print(f"{model:<16}{nodes // len(mbs):>9}" + "".join(f"{v:>10.3f}" for v in med.values())
              + ratio, flush=True)
    with open("/proc/loadavg") as f:
        print(f"load average at end: {' '.join(f.read().split()[:3])}")


def _breakdown(args: argparse.Namespace, load: list[str]) -> None:
    """``--breakdown``: median CPU us per node of each phase over the rounds."""
    print(f"load average at start: {' '.join(load)}; CPU us per recorded node by phase, "
          f"median of {args.rounds} rounds of {args.minibatches} mini-batches of 64; floor: "
          f"the user code on a StubBatch (ops return a constant)")
    phases = ("record", "assemble", "end", "floor")
    print(f"{'model':<16}{'nodes/mb':>9}" + "".join(f"{k:>10}" for k in phases)
          + f"{'total':>10}{'- floor':>10}")
    for model in args.models:
        wl = make_workload(MODELS[model], embed_dim=8, hidden_dim=8)
        data = wl.load("train")
        mbs = [list(data[k * 64:(k + 1) * 64]) for k in range(args.minibatches)]
        time_breakdown(model, wl, args.dim, mbs[:1])  # warm up
        rounds = [time_breakdown(model, wl, args.dim, mbs) for _ in range(args.rounds)]
        med = {k: statistics.median(1e6 * r[k] / r["nodes"] for r in rounds) for k in phases}
        total = med["record"] + med["assemble"] + med["end"]
        print(f"{model:<16}{int(rounds[0]['nodes']) // len(mbs):>9}"
              + "".join(f"{med[k]:>10.3f}" for k in phases)
              + f"{total:>10.3f}{total - med['floor']:>10.3f}", flush=True)
    with open("/proc/loadavg") as f:
        print(f"load average at end: {' '.join(f.read().split()[:3])}")


if __name__ == "__main__":
    _args.run(main)
