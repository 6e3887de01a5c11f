"""experiments.frontier_net end to end on tiny lattice mini-batches, and its bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.frontier_net import config, main, run


def test_tiny_run_writes_weights_and_a_guarded_fsm(tmp_path: Path) -> None:
    st = run(config(["trainer.rounds=1", "trainer.epochs=2", "trainer.hidden=4",
                     "trainer.distill_encodings=[expert]", "num_train_graphs=1",
                     "val_from_train=1", "eval_limit=1", "batch_size=4", "rollout=false",
                     f"out={tmp_path}"]))
    assert (tmp_path / "frontier_net.npz").is_file() and (tmp_path / "fsm.json").is_file()
    assert st["ratios"]["frontier_net_fsm"] >= 1.0 and st["fallback"]
    assert set(st["ratios"]) == {"critical_path", "frontier_net", "frontier_net_fsm"}


@pytest.mark.parametrize(("arg", "said"), [("workload=nope", "unknown workload 'nope'"),
                                           ("colour=red", "unknown option")])
def test_bad_input_is_one_line(arg: str, said: str, capsys: pytest.CaptureFixture) -> None:
    assert main([arg]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
