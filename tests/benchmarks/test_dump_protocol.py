"""benchmarks/dump_protocol.py end to end on a small export (slow: subprocess CLIs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "dump_protocol.py"


@pytest.mark.slow
def test_lattice_protocol_trains_on_g0_and_reports_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--workload", "lattice_lstm",
                           "--graphs", "3", "--batch-size", "8", "--seeds", "0", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=900,
                          cwd=SCRIPT.parents[1], check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["test_graphs"] == 2 and data["seeds"] == [0, 1]
    rows = {r["scheduler"]: r for r in data["rows"]}
    assert set(rows) == {"fsm", "fsm_fallback_only", "dynet_agenda", "typewise_greedy",
                         "typewise_greedy_backward", "critical_path"}
    assert rows["fsm"]["seeds"] == 2 and rows["critical_path"]["seeds"] == 1
    # the ablation row (the same fallback and lookahead, no table) is reported per seed too
    assert rows["fsm_fallback_only"]["seeds"] == 2
    # lattices: the FSM (a heuristic fallback chosen on G0, plus rollout) beats DyNet's agenda
    assert rows["fsm"]["mean_batches"] < rows["dynet_agenda"]["mean_batches"]
    assert all(r["ratio_to_lb"] >= 1.0 for r in rows.values())
    # the path bound: a lower bound on every schedule, at least LB, per graph and overall
    assert data["mean_path_bound"] >= data["mean_lb"]
    assert all(r["ratio_to_path_bound"] >= 1.0 for r in rows.values())
    assert all(g["lower_bound"] <= g["path_bound"] <= g["num_batches"] for g in data["graphs"])


def _module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("dump_protocol", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ed_batch_fsm_trains_with_ed_batchs_learner_unless_told_otherwise(tmp_path: Path) -> None:
    dp = _module()
    args = dp.parse_args(["--policy", "ed_batch_fsm"])
    assert "trainer=ed_batch" in dp.train_overrides(args, tmp_path, 0, tmp_path / "r")
    args = dp.parse_args(["--policy", "ed_batch_fsm", "--trainer", "expert",
                          "--lookahead", "none"])
    over = dp.train_overrides(args, tmp_path, 3, tmp_path / "r")
    assert "trainer=expert" in over and "++trainer.lookahead=none" in over and "seed=3" in over
    assert "trainer=q_learning" in dp.train_overrides(dp.parse_args([]), tmp_path, 0, tmp_path)


def test_workload_label_follows_the_folder_and_default_out_is_outside_the_checkout() -> None:
    dp = _module()
    assert dp.workload_label(dp.parse_args(["--folder", "/x/bilstm/B64"])) == "bilstm_B64"
    assert dp.workload_label(dp.parse_args(["--folder", "/x/mvrnn_B1"])) == "mvrnn_B1"
    assert dp.workload_label(dp.parse_args(["--workload", "tree_lstm"])) == "tree_lstm"
    out = dp.default_out("bilstm_B64")
    assert SCRIPT.parents[1] not in out.resolve().parents and out.name == "bilstm_B64.json"


def test_split_all_is_documented_in_the_help() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0 and "split=all" in proc.stdout


def test_table_stats_names_graphs_by_file_and_reports_the_ablation(tmp_path: Path) -> None:
    from edbatch.workloads.dumps import DumpWorkload
    from policies import FSMPolicy
    from policies.expert import ExpertConfig, train_expert

    dp = _module()
    folder = SCRIPT.parents[1] / "data" / "graphs" / "mvrnn_B1"
    wl = DumpWorkload(folder)
    res = train_expert(wl.graphs()[:1], ExpertConfig(rounds=1, budget=5_000,
                                                     fallback="critical_path"))
    path = res.policy.save(tmp_path / "policy.json")
    stats = dp.table_stats(path, folder, 1)
    assert dp.graph_names(folder, 1)[0] == "G1.txt" == next(iter(stats["fallback_only"]))
    assert len(stats["fallback_only"]) == len(wl.dumps) - 1
    assert stats["states"] == FSMPolicy.load(path).num_states
    assert 0.0 <= stats["hit_rate"] <= 1.0 and stats["train_seconds"] > 0


@pytest.mark.slow
def test_expert_protocol_rows_carry_states_hit_rate_and_the_ablation(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--workload", "lattice_lstm",
                           "--graphs", "3", "--batch-size", "8", "--seeds", "0",
                           "--trainer", "expert", "--lookahead", "none", "--keep",
                           "--extra", "trainer.budget=20000", "--out", str(out)],
                          capture_output=True, text=True, timeout=900,
                          cwd=SCRIPT.parents[1], check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    rows = {r["scheduler"]: r for r in data["rows"]}
    assert {"fsm", "fsm_fallback_only"} <= set(rows)
    assert {"states", "hit_rate", "ratio_to_lb"} <= set(rows["fsm"])
    assert data["workload"] == "lattice_lstm" and data["trainer"] == "expert"
    assert {g["graph"] for g in data["graphs"]} == {"G1.txt", "G2.txt"}
    assert (tmp_path / "summary_runs" / "seed0" / "policy.json").is_file()


def test_summary_rows_report_the_path_bound_only_when_given() -> None:
    mod = _module()
    per_seed = {"fsm": {0: 220.0, 1: 240.0}, "critical_path": {0: 250.0}}
    lb = {"G1.txt": 100, "G2.txt": 100}
    stats = [{"states": 4, "hit_rate": 0.5, "train_seconds": 1.0}] * 2
    plain = {r["scheduler"]: r for r in mod.summary_rows(per_seed, lb, stats)}
    assert "ratio_to_path_bound" not in plain["fsm"]
    rows = {r["scheduler"]: r for r in mod.summary_rows(per_seed, lb, stats,
                                                         {"G1.txt": 110, "G2.txt": 90})}
    assert rows["fsm"]["mean_batches"] == 115.0 and rows["fsm"]["ratio_to_lb"] == 1.15
    assert rows["critical_path"]["ratio_to_path_bound"] == 1.25


def test_train_graphs_needs_an_exported_workload_and_a_count() -> None:
    dp = _module()
    for argv in (["--train-graphs", "2", "--folder", "/x/lattice/B64"],
                 ["--train-graphs", "2", "--compose", "bilstm_B1"], ["--train-graphs", "-1"],
                 ["--k", "0"]):
        with pytest.raises(SystemExit):
            dp.parse_args(argv)
    args = dp.parse_args(["--train-graphs", "3", "--k", "2", "--trainer", "expert"])
    over = dp.train_overrides(args, Path("/t"), 0, Path("/r"), num_types=9)
    assert "train_split=first:5" in over and "num_train_graphs=5" in over
    assert "val_split=first:5" in over and "++workload.dumps.num_types=9" in over
    assert "++workload.dumps.num_types=9" not in dp.train_overrides(
        dp.parse_args([]), Path("/t"), 0, Path("/r"))


def test_training_graphs_are_the_first_k_dumps_then_disjoint_mini_batches(tmp_path: Path
                                                                           ) -> None:
    import numpy as np

    from edbatch.data.dumps import load_dump_folder

    dp = _module()
    evaluation, train = tmp_path / "eval", tmp_path / "train"
    dp.export("lattice_lstm", 3, 8, True, evaluation)
    args = dp.parse_args(["--graphs", "3", "--batch-size", "8", "--k", "1",
                          "--train-graphs", "3", "--train-split", "train,dev"])
    assert dp.export_training(args, True, evaluation, train) == [
        "G0.txt", "train[3]", "train[4]", "train[5]"]
    got, ev = load_dump_folder(train), load_dump_folder(evaluation)
    assert [Path(d.path).name for d in got] == ["G0.txt", "G1.txt", "G2.txt", "G3.txt"]
    assert np.array_equal(got[0].types, ev[0].types)  # G0: the evaluation folder's own

    def same(a, b) -> bool:
        return a.num_nodes == b.num_nodes and np.array_equal(a.args, b.args)

    # the extra mini-batches are none of the evaluation (test) dumps
    assert not any(same(a, b) for a in got[1:] for b in ev)
    # the dev split's mini-batches come after the train split's disjoint ones
    args = dp.parse_args(["--graphs", "143", "--batch-size", "8", "--train-graphs", "2",
                          "--train-split", "train,dev"])
    assert dp.export_training(args, True, evaluation, tmp_path / "t2")[1:] == [
        "train[143]", "dev[0]"]
    args = dp.parse_args(["--batch-size", "64", "--train-graphs", "9", "--train-split", "dev"])
    with pytest.raises(SystemExit, match="holds only 2 mini-batches"):
        dp.export_training(args, True, evaluation, tmp_path / "t3")
    # --train-shuffles: the same disjoint instances cut into other mini-batches
    args = dp.parse_args(["--batch-size", "64", "--train-graphs", "4", "--train-split", "dev",
                          "--train-shuffles", "1"])
    assert dp.export_training(args, True, evaluation, tmp_path / "t4") == [
        "G0.txt", "dev[0]", "dev[1]", "dev~1[0]", "dev~1[1]"]
    shuf = load_dump_folder(tmp_path / "t4")
    assert sum(d.num_nodes for d in shuf[1:3]) == sum(d.num_nodes for d in shuf[3:5])
    assert not same(shuf[1], shuf[3])  # reshuffled: other mini-batches of the same lattices
    with pytest.raises(SystemExit):
        dp.parse_args(["--train-shuffles", "-1"])


@pytest.mark.slow
def test_train_graphs_run_trains_on_other_mini_batches_and_tests_every_dump(tmp_path: Path
                                                                            ) -> None:
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--graphs", "3", "--batch-size", "8",
                           "--split", "test", "--k", "0", "--train-graphs", "2",
                           "--train-split", "train", "--seeds", "0", "--trainer", "expert",
                           "--lookahead", "none", "--extra", "trainer.augment=0",
                           "--out", str(out)], capture_output=True, text=True, timeout=900,
                          cwd=SCRIPT.parents[1], check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["trained_on"] == ["train[0]", "train[1]"] and data["train_graphs"] == 2
    # --k 0: every exported test-split dump is a test graph
    assert {g["graph"] for g in data["graphs"]} == {"G0.txt", "G1.txt", "G2.txt"}
    rows = {r["scheduler"]: r for r in data["rows"]}
    assert rows["fsm"]["states"] > 0 and rows["fsm_fallback_only"]["seeds"] == 1
