"""``fallback=auto`` of the expert trainer: the fallback is chosen by its *searched* table."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edbatch.errors import ConfigError
from edbatch.schedule import lower_bound
from edbatch.workloads import make_workload
from policies import FSMPolicy
from policies.expert import ExpertConfig, resample_graphs, train_expert
from policies.fallback_search import estimate, search_fallbacks
from policies.q_learning import AUTO_FALLBACKS
from policies.table_search import search_table, table_batches

AUTO = ExpertConfig(rounds=0, augment=4, fallback="auto", search_sweeps=2, search_max_evals=40,
                    auto_probe_evals=15, auto_finalists=2)
CANDIDATES = ("critical_path", "typewise_greedy", "ed_batch_agenda")


@pytest.fixture(scope="module")
def lattice() -> tuple[list, list, list]:
    wl = make_workload("lattice_lstm", granularity="primitive")
    graphs = list(wl.batches("train", 2, limit=2))
    extra = resample_graphs(graphs[:1], 4, np.random.default_rng(0))
    return [graphs[0], *extra[:2]], extra[2:], graphs[1:]


@pytest.fixture(scope="module")
def choice(lattice):  # type: ignore[no-untyped-def]
    train, check, val = lattice
    return search_fallbacks(CANDIDATES, train, check, val, "expert", probe_evals=15,
                            finalists=2, sweeps=2, max_evals=40)


def test_every_candidate_is_scored_by_its_own_search(lattice, choice) -> None:
    train, check, val = lattice
    assert list(choice.scores) == list(CANDIDATES)
    for name, row in choice.scores.items():
        assert row["bare"] == table_batches({}, val, "expert", name)
        probe, st = search_table({}, train, check, "expert", name, sweeps=1, max_evals=15)
        assert row["probe"] == table_batches(probe, val, "expert", name)
        assert row["best"] == min(row["bare"], row["probe"] if row["searched"] is None
                                  else row["searched"])
        assert row["evaluations"] >= st.evaluations
        assert row["whole"] == table_batches({}, [*train, *val], "expert", name)
    # the two best probes (by their estimate) went on to the full search, the third did not
    lb = sum(lower_bound(g) for g in [*train, *val])
    probed = sorted(CANDIDATES, key=lambda n: (
        choice.scores[n]["whole"] / lb * min(choice.scores[n]["bare"], choice.scores[n]["probe"])
        / choice.scores[n]["bare"], CANDIDATES.index(n)))
    assert [n for n in CANDIDATES if choice.scores[n]["searched"] is not None] == sorted(
        probed[:2], key=CANDIDATES.index)


def test_the_best_searched_table_on_validation_wins(lattice, choice) -> None:
    _, _, val = lattice
    finals = [n for n in CANDIDATES if choice.scores[n]["searched"] is not None]
    ratios = choice.ratios()
    best = min(ratios[n]["estimate"] for n in finals)  # type: ignore[type-var]
    assert choice.fallback == next(n for n in finals if ratios[n]["estimate"] == best)
    assert choice.batches == table_batches(choice.table, val, "expert", choice.fallback)
    assert choice.scores[choice.fallback]["searched"] == choice.batches
    assert ratios[choice.fallback]["searched_ratio"] == pytest.approx(choice.batches / choice.lb)


def test_the_searched_table_decides_not_the_bare_heuristic() -> None:
    """BiLSTM tagger, primitive, 2 sentences: type-wise greedy alone needs fewer validation
    batches than the DyNet agenda alone (894 vs 1032), but the agenda's searched table needs
    fewer than type-wise greedy's (819 vs 894): auto keeps the agenda."""
    wl = make_workload("bilstm_tagger", granularity="primitive")
    graphs = list(wl.batches("train", 2, limit=2))
    extra = resample_graphs(graphs[:1], 4, np.random.default_rng(0))
    train, check, val = [graphs[0], *extra[:2]], extra[2:], graphs[1:]
    pair = ("typewise_greedy", "dynet_agenda")
    ch = search_fallbacks(pair, train, check, val, "expert", probe_evals=20, finalists=2,
                          sweeps=2, max_evals=40)
    s = ch.scores
    assert s["typewise_greedy"]["bare"] < s["dynet_agenda"]["bare"]  # the heuristics' pick
    assert s["dynet_agenda"]["searched"] < s["typewise_greedy"]["best"]  # type: ignore[operator]
    assert ch.fallback == "dynet_agenda"
    assert ch.batches == table_batches(ch.table, val, "expert", "dynet_agenda")
    # with one finalist only the better probe (type-wise greedy's) gets the full search
    one = search_fallbacks(pair, train, check, val, "expert", probe_evals=20, finalists=1,
                           sweeps=2, max_evals=40)
    assert one.fallback == "typewise_greedy" and one.scores["dynet_agenda"]["searched"] is None


def test_the_estimate_measures_the_fallback_on_every_graph_and_the_table_on_validation(
        ) -> None:
    """Two validation graphs favour B alone by 1%, every graph favours A alone by 2.5%:
    with no table gain A wins; a table gaining 5% on validation makes B win."""
    a = {"whole": 1250, "bare": 1180, "best": 1180}
    b = {"whole": 1280, "bare": 1168, "best": 1168}
    assert estimate(a, 1000) == pytest.approx(1.25) and estimate(a, 1000) < estimate(b, 1000)
    assert estimate({**b, "best": 1110}, 1000) < estimate(a, 1000)


def test_ties_go_to_the_earlier_candidate(lattice) -> None:
    train, check, val = lattice
    a = search_fallbacks(("critical_path", "typewise_greedy"), train, check, val, "expert",
                         probe_evals=0, finalists=2, sweeps=0, max_evals=0)
    # no search at all: every candidate is its bare fallback, the fewest batches wins
    s = a.scores
    order = ("critical_path", "typewise_greedy")
    assert a.fallback == min(order, key=lambda n: (s[n]["whole"], order.index(n)))
    assert a.table == {}


def test_probing_stops_when_a_fallback_meets_the_lower_bound() -> None:
    wl = make_workload("tree_lstm")
    graphs = list(wl.batches("train", 8, limit=2))
    ch = search_fallbacks(AUTO_FALLBACKS, graphs[:1], [], graphs[1:], "expert")
    assert list(ch.scores) == ["critical_path"]  # the first candidate already meets LB
    assert ch.fallback == "critical_path" and ch.table == {} and ch.stats.evaluations == 0


def test_no_candidates_is_a_config_error(lattice) -> None:
    train, check, val = lattice
    with pytest.raises(ConfigError, match="candidates"):
        search_fallbacks([], train, check, val, "expert")


def test_auto_trainer_is_deterministic_and_records_the_candidates(lattice,
                                                                  tmp_path: Path) -> None:
    train, _, val = lattice
    a = train_expert(train[:1], AUTO, val_graphs=val)
    b = train_expert(train[:1], AUTO, val_graphs=val)
    assert json.dumps(a.policy.to_json()["table"]) == json.dumps(b.policy.to_json()["table"])
    meta = a.policy.metadata["auto_fallback"]
    # the kept table is scored on the validation and check graphs, like the fallback alone
    assert 1.0 <= a.best_ratio <= a.policy.metadata["fallback_ratio"]
    assert json.dumps(meta) == json.dumps(b.policy.metadata["auto_fallback"])
    assert meta["chosen"] == a.policy.fallback_name
    assert a.policy.metadata["config"]["fallback"] == a.policy.fallback_name
    assert set(meta["candidates"]) <= set(AUTO_FALLBACKS)
    row = meta["candidates"][a.policy.fallback_name]
    assert row["searched_ratio"] is not None and row["bare_ratio"] > 0
    loaded = FSMPolicy.load(a.policy.save(tmp_path / "p.json"), train[0].vocab)
    assert loaded.metadata["auto_fallback"] == meta
    assert loaded.fallback_name == a.policy.fallback_name and loaded.table == a.policy.table


def test_explicit_fallback_is_not_searched_over(lattice) -> None:
    train, _, val = lattice
    res = train_expert(train[:1], replace(AUTO, fallback="typewise_greedy"), val_graphs=val)
    assert res.policy.fallback_name == "typewise_greedy"
    assert "auto_fallback" not in res.policy.metadata
