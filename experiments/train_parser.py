"""Train the transition parser through edbatch and score its own parses:
``python -m experiments.train_parser [--epochs 1] [--train-limit 6000] ...``.

The model is :class:`~experiments.parser_model.ApiParser` (the ``transition_parser``
workload's cells written per sentence through ``edbatch.api``). Every mini-batch of
projective train sentences records each sentence's BiLSTM and one loss per oracle
transition, and one batched ``run()`` (scheduler ``--scheduler``) computes the loss; Adam
updates the parameters on the mean loss per sentence. Word dropout as Kiperwasser &
Goldberg: a train word of count ``c`` reads the unknown row with probability
``alpha / (alpha + c)``.

After each epoch every dev sentence (non-projective ones included) is parsed greedily by
``run_programs``: the parser follows its own predicted transitions, all sentences of an
evaluation batch synchronising once per decision round. UAS and LAS count every word,
punctuation included. The parameters of the best dev UAS are scored on test. The embeddings
start random (no pre-trained vectors ship with the repository); the UPOS tags are the gold
ones.

The JSON summary (``--out``) holds the settings, per-epoch figures, dev and test UAS/LAS and
the wall time.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from edbatch.data.ud import UPOS_TAGS
from edbatch.memory import Strategy
from edbatch.workloads.transition_parser import TransitionParser, attachment_scores
from experiments import _task_train as task
from experiments.parser_model import ApiParser

__all__ = ["evaluate", "train", "word_dropout"]

log = logging.getLogger("experiments.train_parser")


def word_dropout(wl: TransitionParser, attrs: Sequence[int], words: Sequence[str],
                 alpha: float, rng: np.random.Generator) -> list[int]:
    """``attrs`` with each known word replaced by the unknown id with probability
    ``alpha / (alpha + count)`` (its UPOS part kept)."""
    tags = len(UPOS_TAGS)
    counts = np.array([wl.words.counts.get(w, 0) for w in words], dtype=np.float64)
    drop = rng.random(len(words)) < alpha / (alpha + np.maximum(counts, 1e-9))
    return [a % tags if d else a for a, d in zip(attrs, drop, strict=True)]


def evaluate(model: ApiParser, split: str, batch_size: int, scheduler: str,
             limit: int | None = None, strategy: Strategy = "aligned") -> dict[str, float]:
    """UAS / LAS of the parser's own greedy parses of ``split`` (every sentence, or the
    first ``limit``), with the synchronisations per evaluation batch."""
    wl = model.wl
    sentences = list(wl.sentences(split))[:limit]
    heads: list[list[int]] = []
    labels: list[list[str]] = []
    syncs = []
    with torch.no_grad():
        for lo in range(0, len(sentences), batch_size):
            chunk = sentences[lo:lo + batch_size]
            parses, run = model.parse([wl.embed_attrs(s) for s in chunk], scheduler, strategy)
            syncs.append(run.syncs)
            for h, lab, _ in parses:
                heads.append(h)
                labels.append([wl.labels[k] for k in lab])
    scores = attachment_scores(sentences, heads, labels if wl.labelled else None)
    return {**scores, "sentences": len(sentences), "max_syncs": max(syncs)}


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train, pick the epoch by dev UAS, score it on test; return the summary."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    wl = TransitionParser(embed_dim=args.embed_dim, pos_dim=args.pos_dim,
                          hidden_dim=args.hidden_dim, mlp_dim=args.mlp_dim, layers=args.layers,
                          labelled=not args.unlabelled, min_count=args.min_count)
    params, opt = task.adam(wl, args.seed, args.lr)
    model = ApiParser(wl, params)
    rng = np.random.default_rng(args.seed)
    train_set = list(wl.load("train"))
    if args.train_limit is not None and args.train_limit < len(train_set):
        keep = np.sort(rng.choice(len(train_set), args.train_limit, replace=False))
        train_set = [train_set[k] for k in keep]
    history: list[dict[str, float]] = []
    best: tuple[float, dict[str, torch.Tensor], dict[str, float]] | None = None
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(train_set))
        total, steps = 0.0, 0
        for lo in range(0, len(order), args.batch_size):
            batch = [train_set[k] for k in order[lo:lo + args.batch_size]]
            attrs = [word_dropout(wl, inst.embed_attrs, inst.sentence.words, args.alpha, rng)
                     for inst in batch]
            loss = model.loss(batch, args.scheduler, attrs, args.strategy)
            total += task.step(opt, loss, len(batch))
            steps += sum(len(inst.classes) for inst in batch)
        dev = evaluate(model, "dev", args.eval_batch_size, args.scheduler, args.eval_limit,
                       args.strategy)
        history.append({"epoch": epoch, "train_loss_per_transition": total / steps,
                        "seconds": time.perf_counter() - start,
                        **{f"dev_{k}": v for k, v in dev.items()}})
        log.info("epoch %d: train loss %.4f per transition, dev UAS %.4f LAS %.4f (%.0fs)",
                 epoch, total / steps, dev["uas"], dev.get("las", float("nan")),
                 history[-1]["seconds"])
        if best is None or dev["uas"] > best[0]:
            best = (dev["uas"], task.snapshot(params), dev)
    assert best is not None
    with torch.no_grad():
        for k, v in best[1].items():
            params[k].copy_(v)
    dev = best[2]
    if args.save_params:
        torch.save(best[1], args.save_params)
    test = evaluate(model, "test", args.eval_batch_size, args.scheduler, args.eval_limit,
                    args.strategy)
    summary = {"workload": wl.name, "settings": vars(args),
               "embeddings": "random (no pre-trained vectors); gold UPOS",
               "train_sentences": len(train_set),
               "train_projective": len(wl.load("train")),
               "nonprojective_left_out": dict(wl.nonprojective),
               "wall_seconds": time.perf_counter() - start, "history": history,
               "best_epoch": task.best_epoch(history, "dev_uas"),
               **{f"dev_{k}": v for k, v in dev.items()},
               **{f"test_{k}": v for k, v in test.items()}}
    log.info("best epoch %d: dev UAS %.4f LAS %.4f; test UAS %.4f LAS %.4f",
             summary["best_epoch"], dev["uas"], dev.get("las", float("nan")), test["uas"],
             test.get("las", float("nan")))
    if args.out:
        task.write_json(args.out, summary, 1)
    return summary


def parser() -> argparse.ArgumentParser:
    """The command-line options."""
    p = argparse.ArgumentParser(prog="python -m experiments.train_parser", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--eval-batch-size", type=int, default=256)
    p.add_argument("--embed-dim", type=int, default=100)
    p.add_argument("--pos-dim", type=int, default=25)
    p.add_argument("--hidden-dim", type=int, default=100)
    p.add_argument("--mlp-dim", type=int, default=100)
    p.add_argument("--layers", type=int, default=1, choices=(1, 2))
    p.add_argument("--min-count", type=int, default=2)
    p.add_argument("--unlabelled", action="store_true", help="three classes, UAS only")
    p.add_argument("--alpha", type=float, default=0.25, help="word dropout alpha")
    p.add_argument("--lr", type=float, default=2e-3)
    task.add_tail_args(p, "runs/transition_parser/train_parser.json",
                  "a random subsample of N projective train sentences", "sentences",
                  ("planned", "aligned", "naive"))
    p.add_argument("--save-params", default=None,
                   help="torch.save the chosen parameters here (benchmarks/parser_inference.py "
                        "--params reads them)")
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point."""
    return task.log_main(parser(), argv, ("epochs", "batch_size", "eval_batch_size", "train_limit",
                                     "eval_limit"), train)


if __name__ == "__main__":
    main()
