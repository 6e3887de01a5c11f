"""benchmarks/dump_protocol.py's ``--priority``: the priority run's overrides and the guard
against ``--trainer priority`` (the FSM rows need an FSM trainer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.dump_protocol import parse_args, priority_overrides


def test_priority_run_trains_on_the_fsm_runs_graphs() -> None:
    args = parse_args(["--priority", "--lookahead", "none", "--extra", "trainer.rounds=1",
                       "--priority-extra", "trainer.iterations=60"])
    out = priority_overrides(args, Path("/d"), 3, Path("/r"))
    assert "trainer=priority" in out and out[-1] == "trainer.iterations=60"
    assert not any(o.startswith("++trainer.lookahead") or o == "trainer=q_learning"
                   for o in out)
    assert "trainer.rounds=1" not in out  # --extra is the FSM trainer's
    assert "train_split=first:1" in out and "seed=3" in out and "run_dir=/r" in out


def test_trainer_priority_alone_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--trainer", "priority"])
    assert "pass --priority" in capsys.readouterr().err
