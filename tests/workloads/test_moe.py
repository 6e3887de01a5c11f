"""The ``moe`` workload: seeded gate noise, routing in the graph builder, bad input."""

from __future__ import annotations

import pytest
import torch

from edbatch.errors import GraphError
from edbatch.workloads import make_workload
from edbatch.workloads.moe import gate_noise, noise_key, pack_choice, unpack_choice


def _small(**kw):  # type: ignore[no-untyped-def]
    args = {"dim": 6, "expert_dim": 5, "experts": 4, "max_sentences": 8, "max_words": 10,
            "vocab_size": 200, **kw}
    return make_workload("moe", **args)


def test_gate_noise_is_a_seeded_standard_normal() -> None:
    keys = torch.arange(20000, dtype=torch.int64) * 7919
    n = gate_noise(keys, 8, torch.float64)
    assert n.shape == (20000, 8)
    assert abs(float(n.mean())) < 0.02 and abs(float(n.std()) - 1.0) < 0.02
    torch.testing.assert_close(gate_noise(keys[5:9], 8, torch.float64), n[5:9])  # per row
    assert not torch.equal(n[0], n[1])
    assert noise_key(-1, 3, 4, 1) == -1 and noise_key(2, 3, 4, 1) != noise_key(2, 3, 4, 0)


def test_pack_choice_round_trips() -> None:
    codes = torch.tensor([pack_choice([3, 1], 8), pack_choice([0, 7], 8)])
    assert unpack_choice(codes, 8, 2).tolist() == [[3, 1], [0, 7]]


def test_graph_follows_the_routing_and_noise_changes_it() -> None:
    w = _small()
    inst = w.load("dev")[0]
    g = w.minibatch("dev", [0])
    names = [w.vocab[int(o)].name for o in g.op_ids]
    used = {n for n in names if n.startswith("moe.expert0.")}
    want = {f"moe.expert0.{a}" for c in w.routes(inst)[0] for a in c}
    assert used == want and names.count("moe.combine") == 2 * len(inst)
    before = [r for layer in w.routes(inst) for r in layer]
    w.set_noise_round(1)  # noise only in training: other routes for some token, graph rebuilt
    after = [r for layer in w.routes(inst) for r in layer]
    assert before != after and w.minibatch("dev", [0]).num_nodes == g.num_nodes


@pytest.mark.parametrize(("kw", "match"), [({"top_k": 5}, "top_k=5 must be <= experts=4"),
                                           ({"dim": 0}, "dim must be a positive int"),
                                           ({"granularity": "primitive"}, "only granularity")])
def test_bad_sizes_are_one_line_errors(kw: dict[str, object], match: str) -> None:
    with pytest.raises(GraphError, match=match):
        _small(**kw)


def test_routing_params_must_be_complete() -> None:
    w = _small()
    params = dict(w.routing_params)
    del params["moe.gate1.W"]
    with pytest.raises(GraphError, match="'moe.gate1.W' is missing"):
        w.set_routing_params(params)


def test_key_lists_are_the_keys() -> None:
    w = _small()
    inst = w.load("train")[2]
    for noise_round in (-1, 4, 4, -1, 7):  # (made once per sentence and round)
        w.set_noise_round(noise_round)
        assert w.key_lists(inst) == w.keys(inst).t().tolist()
