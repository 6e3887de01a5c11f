"""``auto`` batching: the candidates are timed round-robin, the fastest median is kept, and
whatever is chosen computes the same loss (edbatch.executor.auto, DynamicBatch "auto")."""

from __future__ import annotations

import pytest
import torch

import edbatch.api._batch as batch_module
from edbatch.api import DynamicBatch
from edbatch.api._schedulers import AutoScheduler
from edbatch.errors import ConfigError, UnknownNameError
from edbatch.executor.auto import AUTO_SCHEDULERS, AutoBatching, Candidate, make_candidates
from edbatch.schedule import make_scheduler
from tests.test_api import DIM, TREES, _grads, _modules, _plain_loss, _record


class FakeClock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _candidates(*labels: str) -> list[Candidate]:
    return [Candidate(label, make_scheduler("depth"), "naive") for label in labels]


def test_candidates_are_tried_round_robin_and_the_fastest_median_is_kept() -> None:
    clock = FakeClock()
    auto = AutoBatching(_candidates("a", "b", "c"), trials=3, clock=clock)
    cost = {"a": [3.0, 3.0, 3.0], "b": [1.0, 9.0, 1.5], "c": [2.0, 2.0, 2.0]}  # b: one outlier
    seen = []
    for _ in range(9):
        assert auto.deciding
        with auto.timed() as cand:
            seen.append(cand.label)
            clock.now += cost[cand.label][len(auto.timings[cand.label])]
    assert seen == ["a", "b", "c"] * 3
    assert auto.chosen is not None and auto.chosen.label == "b"  # median 1.5, mean 3.8
    assert auto.timings == cost
    assert auto.summary() == {"chosen": "b", "trials": 3,
                              "median_s": {"a": 3.0, "b": 1.5, "c": 2.0}, "timings_s": cost}
    with auto.timed() as cand:  # after the choice: the winner, and nothing more is recorded
        clock.now += 100.0
    assert cand.label == "b" and auto.timings == cost and not auto.deciding


def test_ties_go_to_the_first_candidate_and_one_candidate_needs_no_trials() -> None:
    clock = FakeClock()
    auto = AutoBatching(_candidates("a", "b"), trials=2, clock=clock)
    for _ in range(4):
        with auto.timed():
            clock.now += 1.0
    assert auto.chosen is not None and auto.chosen.label == "a"
    single = AutoBatching(_candidates("only"), trials=5)
    assert not single.deciding and single.current().label == "only"


def test_the_leader_is_the_fastest_so_far_and_agree_decides_for_all_ranks() -> None:
    clock = FakeClock()
    auto = AutoBatching(_candidates("a", "b"), trials=1, clock=clock,
                        agree=lambda medians: [m + (10.0 if i == 1 else 0.0)
                                               for i, m in enumerate(medians)])
    assert auto.leader().label == "a"  # nothing timed yet: the first
    auto.record(auto.current(), 5.0)
    assert auto.leader().label == "a"
    auto.record(auto.current(), 1.0)  # b is faster here, but the agreed medians say a
    assert auto.chosen is not None and auto.chosen.label == "a"
    assert auto.medians() == {"a": 5.0, "b": 1.0}


def test_a_failed_mini_batch_records_nothing() -> None:
    auto = AutoBatching(_candidates("a", "b"), trials=1, clock=FakeClock())
    with pytest.raises(RuntimeError), auto.timed():
        raise RuntimeError("kernel failed")
    assert auto.timings == {"a": [], "b": []} and auto.current().label == "a"


def test_candidates_cross_schedulers_with_strategies_fsm_first() -> None:
    fsm = make_scheduler("typewise_greedy")
    labels = [c.label for c in make_candidates(["depth", "critical_path"], ["aligned", "naive"],
                                               fsm)]
    assert labels == ["fsm/aligned", "fsm/naive", "depth/aligned", "depth/naive",
                      "critical_path/aligned", "critical_path/naive"]
    assert len(make_candidates()) == 2 * len(AUTO_SCHEDULERS)


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"schedulers": ["dpeth"]}, UnknownNameError, ["'dpeth'", "'depth'"]),
    ({"strategies": ["alligned"]}, UnknownNameError, ["'alligned'", "'aligned'"]),
    ({"schedulers": []}, ConfigError, ["at least one"]),
    ({"strategies": ["naive", "naive"]}, ConfigError, ["distinct"]),
])
def test_bad_candidates_are_refused_naming_the_value(kwargs: dict, error: type,
                                                     words: list[str]) -> None:
    with pytest.raises(error) as info:
        make_candidates(**kwargs)
    assert all(w in str(info.value) for w in words)


@pytest.mark.parametrize("trials", [0, -1, 1.5, True])
def test_bad_trials_are_refused(trials: object) -> None:
    with pytest.raises(ConfigError, match="trials"):
        AutoBatching(_candidates("a"), trials=trials)  # type: ignore[arg-type]


def test_api_auto_times_every_candidate_and_every_choice_gives_the_reference_loss(
        monkeypatch: pytest.MonkeyPatch) -> None:
    mods = _modules()
    plain, _ = _plain_loss(TREES, *mods)
    plain.backward()
    want = _grads(mods)
    strategies: list[str] = []
    real_plan = batch_module.plan_memory

    def spy(graph, schedule, strategy):  # the real planner; remembers the strategy used
        strategies.append(strategy)
        return real_plan(graph, schedule, strategy)

    monkeypatch.setattr(batch_module, "plan_memory", spy)
    clock = FakeClock()
    cost = {"depth/aligned": 4.0, "depth/naive": 3.0, "typewise_greedy/aligned": 1.0,
            "typewise_greedy/naive": 2.0}
    auto = AutoScheduler(schedulers=["depth", "typewise_greedy"], trials=2, clock=clock)
    batch = DynamicBatch()
    comp = batch.cell(mods[1], "compose", [DIM, DIM], DIM)
    cls = batch.cell(mods[2], "loss", [DIM], (), takes_attr=True)
    ran = []
    for _ in range(len(cost) * 2 + 3):  # the trials, then the winner
        for m in mods:
            m.zero_grad()
        _record(batch, TREES, mods[0], comp, cls)
        out = batch.run(auto, strategy="planned")
        ran.append(auto.candidate.label)
        assert out.loss is not None
        out.loss.backward()
        assert torch.allclose(out.loss, plain, atol=1e-5), auto.candidate.label
        for got, exp in zip(_grads(mods), want, strict=True):
            assert torch.allclose(got, exp, atol=1e-5)
        clock.now += cost[auto.candidate.label]
    assert ran[:8] == list(cost) * 2
    assert auto.chosen == "typewise_greedy/aligned" and ran[8:] == [auto.chosen] * 3
    assert strategies == [label.split("/")[1] for label in ran]
    # the mini-batch after the last trial closes it: the trials' times, nothing after
    assert auto.auto.timings == {k: [v, v] for k, v in cost.items()}


def test_api_auto_by_name_keeps_its_timings_across_runs() -> None:
    mods = _modules()
    batch = DynamicBatch()
    comp = batch.cell(mods[1], "compose", [DIM, DIM], DIM)
    cls = batch.cell(mods[2], "loss", [DIM], (), takes_attr=True)
    for _ in range(3):
        _record(batch, TREES, mods[0], comp, cls)
        batch.run("auto")
    kept = batch._kept["auto"]
    assert isinstance(kept, AutoScheduler)
    assert sum(map(len, kept.auto.timings.values())) == 2  # two runs closed, one open
