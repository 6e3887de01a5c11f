"""experiments.train_moe: the MoE tagger learns through the batched executor."""

from __future__ import annotations

import pytest

from experiments import train_moe


@pytest.mark.slow  # ~1 min on the shared VM
def test_train_moe_beats_the_majority_baseline() -> None:
    out = train_moe.train(train_sentences=300, epochs=2, batch_size=32, dim=16, log=False)
    assert out["dev_accuracy"] > out["dev_majority"] + 0.2


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(SystemExit):
        train_moe.main(["--epochs", "0"])
