"""The throughput benchmark's command line: its contenders, workloads, sizes and modes,
the default run, and the argument parser (``benchmarks/throughput.py --help``)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from benchmarks import _args
from benchmarks._throughput_data import DATA_MODES
from benchmarks._throughput_dynet import DYNET_CONTENDERS, ROOT
from benchmarks._throughput_passes import (
    FLOOR,
    GRAPHED,
    HAND,
    PT_UNBATCHED,
    UNCHAINED,
    UNFUSED,
    UNHOISTED,
)
from benchmarks.models_api import RECORDERS

__all__ = ["CONTENDERS", "DEFAULT_CONTENDERS", "DEFAULT_MINIBATCHES", "DEFAULT_SIZES",
           "DEFAULT_WORKLOADS", "EDBATCH_CONTENDERS", "MODES", "OTHER_CONTENDERS", "SIZES",
           "WORKLOADS", "make_parser", "parse_size"]

DYNET_PEER = ROOT / "benchmarks" / "dynet_peer.py"
EDBATCH_CONTENDERS = ("unbatched", "depth", "dynet_agenda", "fsm", "fsm+aligned",
                      "fsm+planned", "fsm+fastbuild", "fsm+cse", "fsm+planned+memo", GRAPHED,
                      "auto", UNHOISTED, UNFUSED, UNCHAINED)
OTHER_CONTENDERS = (HAND, FLOOR, PT_UNBATCHED)
CONTENDERS = EDBATCH_CONTENDERS + OTHER_CONTENDERS + DYNET_CONTENDERS
#: The registered workloads with a per-instance API model (``benchmarks/peers/<name>.py``).
WORKLOADS = tuple(RECORDERS)
SIZES = ("300x150", "128x128")
MODES = ("infer", "train")
#: What a run without arguments measures (about 3 minutes on 2 idle cores, FSM policies
#: trained on first use included): ED-Batch's three workloads, every mode at the paper's
#: size, 2 mini-batches a pass, the contenders that state the result (the learned FSM
#: against edbatch's own agenda baselines, the hand-batched PyTorch peer, unbatched
#: per-instance PyTorch on the first ``--unbatched-minibatches``, the GEMM floor and DyNet's
#: agenda autobatching). ``--full`` is every workload and contender at both sizes (hours:
#: see --help).
DEFAULT_SIZES = ("300x150",)
#: ED-Batch's three rows; the seeds' workloads (SICK, GGNN, parser, char tagger) with
#: ``--workloads`` or ``--full``
DEFAULT_WORKLOADS = ("tree_lstm", "lattice_lstm", "bilstm_tagger")
DEFAULT_MINIBATCHES = 2
DEFAULT_CONTENDERS = ("depth", "dynet_agenda", "fsm", HAND, PT_UNBATCHED, FLOOR,
                      "dynet_autobatch1")

def parse_size(text: str) -> str:
    """Check an ``EMBEDxHIDDEN`` size string (argparse ``type``); return it unchanged.

    Raises:
        argparse.ArgumentTypeError: not two positive integers joined by ``x``.
    """
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if m is None or min(int(m[1]), int(m[2])) < 1:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: expected EMBEDxHIDDEN with positive integers, e.g. "
            f"300x150 or 128x128")
    return text


def make_parser(description: str) -> argparse.ArgumentParser:
    """The command-line interface, headed by ``description``."""
    p = argparse.ArgumentParser(description=description, epilog=(
        f"The default run (no arguments): the workloads {' '.join(DEFAULT_WORKLOADS)}, "
        f"every mode at "
        f"{' '.join(DEFAULT_SIZES)}, {DEFAULT_MINIBATCHES} mini-batches a pass, contenders "
        f"{' '.join(DEFAULT_CONTENDERS)} ({PT_UNBATCHED}, per-instance PyTorch node by "
        f"node, on the first --unbatched-minibatches only; the table's xunb column divides "
        f"by it): a few minutes on 2 cores, FSM policies trained on first use included. "
        f"--full: every workload and contender at {' '.join(SIZES)} over the whole training "
        f"split (hours)."))
    p.add_argument("--workloads", nargs="+", default=list(DEFAULT_WORKLOADS), choices=WORKLOADS,
                   help=f"default {' '.join(DEFAULT_WORKLOADS)}; all: {' '.join(WORKLOADS)}")
    p.add_argument("--sizes", nargs="+", default=list(DEFAULT_SIZES), type=parse_size,
                   help=f"EMBEDxHIDDEN (default {' '.join(DEFAULT_SIZES)}; the full set: "
                        f"{' '.join(SIZES)})")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--data", choices=DATA_MODES, default="reshuffled",
                   help="reshuffled: every pass draws new mini-batches from a seeded "
                        "permutation of the training split (default); repeated: the same "
                        "first mini-batches of the eval split every pass")
    p.add_argument("--seed", type=_args.seed, default=0, help="seed of the reshuffled permutation")
    p.add_argument("--minibatches", type=int, default=DEFAULT_MINIBATCHES,
                   help=f"mini-batches of 64 per pass (default {DEFAULT_MINIBATCHES}; 0: all "
                        f"of the eval split when repeated, the training split spread over "
                        f"the passes when reshuffled)")
    p.add_argument("--unbatched-minibatches", type=int, default=1,
                   help="mini-batches the slow node-by-node contenders (unbatched, "
                        f"{PT_UNBATCHED}) run (default 1; 0: all)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--no-dynet", action="store_true", help="skip the DyNet rows")
    p.add_argument("--dynet-interleave", action=argparse.BooleanOptionalAction, default=True,
                   help="keep one DyNet worker per autobatch mode running and interleave its "
                        "passes with edbatch's (default); --no-dynet-interleave runs each "
                        "worker's passes as one block (see --dynet-runs)")
    p.add_argument("--dynet-runs", type=int, choices=(1, 2), default=2,
                   help="2: DyNet runs before and after the edbatch passes, the faster run "
                        "counts (conservative under drift); 1: after only")
    p.add_argument("--construction", choices=("api", "fastbuild", "cached"), default="api",
                   help="api: per-instance code on edbatch.api (benchmarks/models_api.py); "
                        "fastbuild: the workload's numpy builder; cached: merge per-instance "
                        "graphs built on first sight (Workload.minibatch)")
    p.add_argument("--cse", action="store_true",
                   help="merge repeated operand-free nodes (edbatch.graph.dedupe_leaves) for "
                        "every edbatch contender (default: only fsm+cse does)")
    p.add_argument("--contenders", nargs="+", default=list(DEFAULT_CONTENDERS),
                   choices=CONTENDERS, metavar="CONTENDER",
                   help=f"default: {' '.join(DEFAULT_CONTENDERS)}; any of {', '.join(CONTENDERS)}"
                        f" (auto: the FSM and the heuristics x aligned/naive timed on the "
                        f"first mini-batches, round-robin, the fastest kept)")
    p.add_argument("--full", action="store_true",
                   help=f"the full set: every contender, sizes {' '.join(SIZES)}, all of the "
                        f"training split per pass (--minibatches 0); hours on 2 cores. "
                        f"Explicit --sizes/--contenders/--minibatches still apply")
    p.add_argument("--policy-dir", default="results/throughput_policies", type=_args.folder,
                   help="FSM policies <workload>_expert.json (--trainer expert) or "
                        "<workload>.json (q_learning), trained here when missing")
    p.add_argument("--trainer", choices=("expert", "q_learning"), default="expert",
                   help="FSM learner of a policy not in --policy-dir (docs/learning.md)")
    p.add_argument("--fsm-episodes", type=_args.positive, default=None,
                   help="override max_episodes when training a missing FSM (testing)")
    p.add_argument("--dynet-peer", type=Path, default=DYNET_PEER,
                   help=argparse.SUPPRESS)
    p.add_argument("--device", type=_args.device, default="cpu",
                   help="cpu or cuda[:N]: where edbatch runs (cuda adds fsm+memo+cugraph)")
    p.add_argument("--out", type=_args.out_file, default=Path("results/throughput.json"))
    p.add_argument("--plot", type=_args.plot_file, default=Path("results/throughput.png"))
    return p
