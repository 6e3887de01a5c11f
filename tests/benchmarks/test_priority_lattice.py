"""``benchmarks/priority_lattice.py --afterstate``: trains the afterstate policy per seed and
saves its artifact (a small budget; the table's runs are the documented commands)."""

from __future__ import annotations

import pytest

from benchmarks.priority_lattice import main
from edbatch.schedule import lower_bound
from edbatch.workloads import make_workload
from experiments._common import graph_set
from policies.afterstate import AfterstatePolicy


def test_afterstate_option_trains_and_saves_an_afterstate_artifact(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = main(["--seeds", "0", "--iterations", "2", "--population", "4", "--elite", "2",
                "--num-train-graphs", "2", "--afterstate", "--context", "--save",
                str(tmp_path)])
    p = AfterstatePolicy.load(tmp_path / "priority_seed0.json")
    assert p.metadata["lookahead"] == "one step (afterstate)" and p.metadata["context"]
    test = graph_set(make_workload("lattice_lstm"), "test", 64, 8)
    assert out[0] == sum(p(g).num_batches for g in test) / sum(lower_bound(g) for g in test)


def test_unknown_extra_column_is_a_one_line_usage_error(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_:
        main(["--afterstate", "--extra", "bogus"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bogus'" in err and "miss2" in err
