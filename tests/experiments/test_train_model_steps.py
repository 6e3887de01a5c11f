"""The training loop's deferred step: each step's gradient sum and Adam update finish when
the next step begins (so preparing the next mini-batch overlaps the ranks' gradient sum);
an evaluation and the end of training must still see every step applied."""

from __future__ import annotations

from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from edbatch.tracking import NullTracker
from experiments._common import one_workload
from experiments._train_model_loop import Trainer, fit

ROOT = Path(__file__).resolve().parents[2]
TINY = ["workload.tree_lstm.embed_dim=8", "workload.tree_lstm.hidden_dim=8", "epochs=2",
        "max_steps=5", "train_limit=48", "batch_size=16", "eval_limit=20",
        "eval_batch_size=20", "log_every=1", "eval_every=2", "batching=critical_path"]


def _adam_steps(trainer: Trainer) -> int:
    state = trainer.opt.state.get(trainer.params["tree_lstm.W_out"], {})
    return int(state["step"]) if "step" in state else 0


def test_every_step_is_applied_before_evaluations_and_at_the_end(tmp_path: Path) -> None:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train_model", [*TINY, f"run_dir={tmp_path}"])
    _, workload, _ = one_workload(cfg.workload, granularity="cell")
    trainer = Trainer(cfg, workload, NullTracker())
    seen: list[tuple[int, int]] = []
    evaluate = trainer.eval

    def eval_seeing_the_updates() -> dict[str, float]:
        row = evaluate()
        seen.append((trainer.step, _adam_steps(trainer)))
        return row

    trainer.eval = eval_seeing_the_updates  # type: ignore[method-assign]
    before = {n: p.detach().clone() for n, p in trainer.params.items()}
    fit(trainer)
    # evaluations at steps 2 and 4 (eval_every), after epoch 1 (3 steps) and epoch 2 (5)
    assert seen == [(2, 2), (3, 3), (4, 4), (5, 5)]
    assert trainer.step == _adam_steps(trainer) == 5 and trainer._pending is None
    assert not torch.equal(before["tree_lstm.W_out"], trainer.params["tree_lstm.W_out"])


def test_gc_freeze_moves_the_loaded_data_out_of_the_collector(tmp_path: Path) -> None:
    """``gc_freeze`` (default true): the trees and mini-batch caches leave the cyclic GC's
    sweeps after loading and after every epoch; ``false`` leaves the collector alone; the
    training itself is the same either way."""
    import gc

    params = {}
    for freeze in (False, True):
        gc.unfreeze()
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose("train_model", [*TINY, f"run_dir={tmp_path}/{freeze}",
                                          f"gc_freeze={freeze}"])
        _, workload, _ = one_workload(cfg.workload, granularity="cell")
        trainer = Trainer(cfg, workload, NullTracker())
        after_init = gc.get_freeze_count()
        assert (after_init > 0) is freeze
        fit(trainer)
        if freeze:  # the epochs' cached mini-batches joined the frozen objects
            assert gc.get_freeze_count() > after_init
        else:
            assert gc.get_freeze_count() == 0
        params[freeze] = {n: p.detach().clone() for n, p in trainer.params.items()}
    gc.unfreeze()
    assert all(torch.equal(params[False][n], params[True][n]) for n in params[False])
