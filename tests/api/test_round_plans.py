"""Round plans (:mod:`edbatch.api._rounds`): a round whose structure was seen before reuses
its plan and gives the same values and gradients as a run without plans (fp64, exactly);
a round of another pattern misses; value nodes read slot by slot are views; inference
reuses one attrs buffer without changing values; ``argmax(handle, allowed)`` picks the best
allowed entry for every program at once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from edbatch.api import DynamicBatch, _segments, argmax
from edbatch.api._rounds import COLD_AFTER, PROBE_EVERY, Lru
from edbatch.api._segments import segment_state
from edbatch.errors import GraphError

DIM, OUT = 4, 6


class Greedy:
    """Greedy decoding: feed back the argmax of a score as the next input row; a loss
    on every state (so gradients cross every round)."""

    def __init__(self) -> None:
        torch.manual_seed(3)
        self.embed = nn.Embedding(OUT, DIM).double()
        self.mix = nn.Linear(2 * DIM, DIM).double()
        self.score = nn.Linear(DIM, OUT).double()
        self.batch = b = DynamicBatch(dtype=torch.float64)
        self.c_step = b.cell(_Mix(self.mix), "step", [DIM, DIM], DIM)
        self.c_score = b.cell(self.score, "score", [DIM], OUT)
        self.c_loss = b.cell(lambda h: h.pow(2).sum(1), "sq", [DIM], ())

    def params(self) -> list[nn.Parameter]:
        return [*self.embed.parameters(), *self.mix.parameters()]

    def program(self, first: int, steps: int):  # type: ignore[no-untyped-def]
        b, out, prev = self.batch, [], first
        h = b.lookup(self.embed, first)
        for _ in range(steps):
            h = self.c_step(h, b.lookup(self.embed, prev))
            prev = yield argmax(self.c_score(h))
            out.append(prev)
            b.add_loss(self.c_loss(h))
        return out

    def run(self, plan: list[tuple[int, int]], grad: bool = True):  # type: ignore[no-untyped-def]
        out = self.batch.run_programs([self.program(f, n) for f, n in plan], grad=grad)
        grads = None
        if grad:
            for p in self.params():
                p.grad = None
            out.loss.backward()
            grads = [p.grad.clone() for p in self.params()]
        return out, grads

    def reference(self, first: int, steps: int) -> tuple[torch.Tensor, list[int]]:
        w = self.embed.weight
        h, prev, out, loss = w[first][None], first, [], torch.zeros((), dtype=torch.float64)
        for _ in range(steps):
            h = torch.tanh(self.mix(torch.cat([h, w[prev][None]], 1)))
            prev = int(self.score(h).argmax())
            out.append(prev)
            loss = loss + h.pow(2).sum()
        return loss, out


class _Mix(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.inner(torch.cat([a, b], 1)))


PLAN = [(0, 4), (1, 4), (2, 4), (4, 4)]


def test_cached_rounds_give_the_values_and_gradients_of_uncached_ones(monkeypatch) -> None:
    model = Greedy()
    first, first_grads = model.run(PLAN)
    rounds = segment_state(model.batch).rounds
    hits = rounds.hits
    assert hits >= 1  # a later round repeats an earlier one's pattern
    model.run(PLAN)  # (the op types are all registered from here on)
    hits, misses = rounds.hits, rounds.misses
    again, again_grads = model.run(PLAN)  # a later mini-batch: every round hits
    assert rounds.hits - hits == again.syncs + 1 and rounds.misses == misses

    monkeypatch.setattr(_segments, "CACHE_SIZE", 0)  # no round plans, no segment cache
    plain_model = Greedy()
    plain, plain_grads = plain_model.run(PLAN)
    assert segment_state(plain_model.batch).rounds.hits == 0
    assert first.returns == again.returns == plain.returns
    assert torch.equal(first.loss, plain.loss) and torch.equal(again.loss, plain.loss)
    for a, b, c in zip(first_grads, again_grads, plain_grads, strict=True):
        assert torch.equal(a, c) and torch.equal(b, c)
    # each cached round's graph keeps its own attrs (token ids) and instances
    for s, t in zip(again.segments, plain.segments, strict=True):
        assert np.array_equal(s.graph.attrs, t.graph.attrs)
        assert np.array_equal(s.graph.instance, t.graph.instance)
        assert np.array_equal(s.graph.op_ids, t.graph.op_ids)
    ref = torch.zeros((), dtype=torch.float64)
    for (f, n), toks in zip(PLAN, plain.returns, strict=True):
        loss, want = plain_model.reference(f, n)
        assert toks == want
        ref = ref + loss
    torch.testing.assert_close(plain.loss, ref, rtol=1e-12, atol=0)


def test_a_round_of_another_pattern_misses() -> None:
    model = Greedy()
    model.run([(0, 2), (1, 2)])
    rounds = segment_state(model.batch).rounds
    misses = rounds.misses
    out, _ = model.run([(0, 2), (1, 2), (2, 2)])  # three sentences: other structures
    assert rounds.misses - misses == out.syncs + 1
    assert out.returns == [model.reference(f, 2)[1] for f in (0, 1, 2)]


def test_inference_reuses_one_attrs_buffer_and_keeps_earlier_values() -> None:
    model = Greedy()
    plan = [(0, 5), (3, 5), (5, 5)]
    out, _ = model.run(plan, grad=False)
    again, _ = model.run(plan, grad=False)
    assert out.returns == again.returns == [model.reference(f, n)[1] for f, n in plan]
    # the values read after the run are those of their own rounds, not the last round's
    for (f, n), toks in zip(plan, again.returns, strict=True):
        assert toks == model.reference(f, n)[1]
    entries = segment_state(model.batch).cache.entries.values()
    assert any(e.inplace is not None for e in entries)


def test_reads_of_value_nodes_slot_by_slot_are_views() -> None:
    """A cell of two operands, both earlier nodes: its value nodes are ordered slot by
    slot, so each slot's read is a slice of the value rows (no gather)."""
    torch.manual_seed(0)
    lin = nn.Linear(2 * DIM, DIM).double()
    batch = DynamicBatch(dtype=torch.float64)
    pair = batch.cell(_Mix(lin), "pair", [DIM, DIM], DIM)
    rows = torch.randn(6, DIM, dtype=torch.float64)

    def program(k: int):  # type: ignore[no-untyped-def]
        a, b = batch.input(rows[k]), batch.input(rows[k + 3])
        yield a  # a synchronisation: a and b are earlier nodes from now on
        value = yield pair(a, b)
        return value

    out = batch.run_programs([program(k) for k in range(3)], grad=False)
    stats = out.segments[1].run.stats
    assert stats["exec/num_gathers"] == 0 and stats["exec/num_views"] == 2
    for k, value in enumerate(out.returns):
        want = torch.tanh(lin(torch.cat([rows[k], rows[k + 3]])))
        torch.testing.assert_close(value, want, rtol=0, atol=1e-15)


def test_argmax_allowed_picks_the_best_allowed_entry_for_every_program() -> None:
    model = Greedy()
    masks = [np.array([k % 2 == 0, True, False, k > 1, False, True]) for k in range(4)]
    got = {}

    def program(k: int, mask: np.ndarray | None):  # type: ignore[no-untyped-def]
        h = model.c_step(model.batch.lookup(model.embed, k), model.batch.lookup(model.embed, k))
        best = yield argmax(model.c_score(h), mask)
        value = yield model.c_score(h)
        got[k] = value
        return best

    plans = [[(k, masks[k]) for k in range(4)], [(k, masks[k] if k % 2 else None)
                                                 for k in range(4)]]
    for plan in plans:
        out = model.batch.run_programs([program(k, m) for k, m in plan], grad=False)
        for (k, mask), best in zip(plan, out.returns, strict=True):
            value = got[k].numpy()
            want = value.argmax() if mask is None else np.where(mask, value, -np.inf).argmax()
            assert best == int(want)
    h = model.batch.lookup(model.embed, 0)
    with pytest.raises(GraphError, match="allowed must be a numpy bool array"):
        argmax(model.c_score(model.c_step(h, h)), [True] * OUT)  # type: ignore[arg-type]
    model.batch.discard()

    def none_allowed():  # type: ignore[no-untyped-def]
        h = model.batch.lookup(model.embed, 0)
        yield argmax(model.c_score(model.c_step(h, h)), np.zeros(OUT, bool))

    with pytest.raises(GraphError, match="allows no entry"):
        model.batch.run_programs([none_allowed(), none_allowed()], grad=False)


def test_a_checked_mask_is_checked_again_for_another_shape_and_read_afresh() -> None:
    """``argmax`` checks a mask array once per row shape (cached by id): the same array on a
    value of another size is still refused; a mask changed in place between mini-batches
    picks by its new entries."""
    model = Greedy()
    mask = np.ones(OUT, bool)
    h = model.batch.lookup(model.embed, 0)
    argmax(model.c_score(model.c_step(h, h)), mask)  # checked for [OUT] rows
    with pytest.raises(GraphError, match="allowed must be a numpy bool array of 6 entries"):
        argmax(model.c_score(model.c_step(h, h)), np.ones(5, bool))
    with pytest.raises(GraphError, match="allowed must be a numpy bool array of 4 entries"):
        argmax(model.c_step(h, h), mask)  # the same array, a [DIM] value
    model.batch.discard()

    def program(k: int):  # type: ignore[no-untyped-def]
        h = model.c_step(model.batch.lookup(model.embed, k), model.batch.lookup(model.embed, k))
        best = yield argmax(model.c_score(h), mask)
        value = yield model.c_score(h)
        return best, value.numpy()

    for keep in ([0, 3], [5], [1, 2, 4]):
        mask[:] = False
        mask[keep] = True
        out = model.batch.run_programs([program(k) for k in range(3)], grad=False)
        for best, value in out.returns:
            assert best == int(np.where(mask, value, -np.inf).argmax())


@pytest.mark.parametrize("kept", [1, 4096])
def test_masked_argmax_by_mask_codes_and_after_the_registry_was_emptied(
        kept: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round of masked ``argmax`` requests picks the best allowed entry per program, the
    masks found by their codes; with a registry of one mask every new mask empties it, so
    the codes of the earlier requests are gone and the masks themselves are read."""
    from edbatch.api import _requests
    monkeypatch.setattr(_requests, "_MASKS_KEPT", kept)
    model = Greedy()
    masks = [np.asarray(m, bool) for m in ([1, 0, 0, 1, 0, 1], [0, 1, 1, 0, 0, 0],
                                          [0, 0, 0, 0, 1, 0])]

    def program(k: int):  # type: ignore[no-untyped-def]
        h = model.c_step(model.batch.lookup(model.embed, k), model.batch.lookup(model.embed, k))
        best = yield argmax(model.c_score(h), masks[k % 3])
        value = yield model.c_score(h)
        return best, value.numpy()

    out = model.batch.run_programs([program(k) for k in range(6)], grad=False)
    for k, (best, value) in enumerate(out.returns):
        assert best == int(np.where(masks[k % 3], value, -np.inf).argmax())
    if kept == 1:  # (the last mask registered: the first programs' codes were gone)
        assert len(_requests._BY_CODE) == 1


def test_a_strided_mask_changed_in_place_picks_by_its_new_entries() -> None:
    """A mask that is a strided view (its flat form a copy) and is edited in place after
    ``argmax`` checked it: the next round picks among its new entries, not the old ones."""
    model = Greedy()
    mask = np.zeros((3, 2), bool).T  # 6 entries, not contiguous: its flat form is a copy

    def program(k: int):  # type: ignore[no-untyped-def]
        h = model.c_step(model.batch.lookup(model.embed, k), model.batch.lookup(model.embed, k))
        best = yield argmax(model.c_score(h), mask)
        value = yield model.c_score(h)
        return best, value.numpy()

    for allowed in ([0, 1], [4, 5]):
        mask[:] = False
        mask.flat[allowed] = True
        out = model.batch.run_programs([program(k) for k in range(4)], grad=False)
        for best, value in out.returns:
            assert best in allowed
            assert best == int(np.where(mask.reshape(-1), value, -np.inf).argmax())


def test_a_mini_batch_of_the_same_structure_and_other_tokens_hits_and_decodes_right(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The seq2seq greedy decoder (hoisted encoder segment, typed rounds): a second
    mini-batch with the same lengths and other tokens runs every segment from the cache
    (the first, hoisted one included: its attrs bound in place at inference) and decodes
    what the per-instance reference decodes. (Direct rounds, which skip the cache for the
    decoding rounds, are off: tests/api/test_direct_rounds.py compares them.)"""
    import importlib.util
    from pathlib import Path

    from benchmarks import decode_torch as dt
    from edbatch.api import _direct

    monkeypatch.setattr(_direct, "DIRECT", False)

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("greedy_decode_rp",
                                                  root / "examples" / "greedy_decode.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = example.Decoder(hidden=8, vocab_size=16, max_len=None, dtype=torch.float64)
    w = dt.Weights(model.params)
    lengths = [3, 5, 2, 5]
    rng = np.random.default_rng(0)
    for _ in range(3):
        sources = [rng.integers(4, 16, size=k).tolist() for k in lengths]
        out = model.batch.run_programs([model.program(s, 6) for s in sources],
                                       "typewise_greedy", grad=False)
        want = dt.greedy_unbatched(w, sources, [6] * len(sources), model.bos, model.eos)
        assert out.returns == want
    state = segment_state(model.batch)
    assert state.cache.misses < state.cache.hits
    assert any(e.inplace is not None and e.plan is not None
               for e in state.cache.entries.values())  # the hoisted first segment's


def _localise_sorted(flat, losses, start, share_at):  # type: ignore[no-untyped-def]
    """The sort-based ``localise`` (the oracle of the marks over a dense range)."""
    is_old = flat < start
    old = np.concatenate([flat[is_old], losses[losses < start]])
    where = np.arange(len(old))
    if len(old) >= share_at * 2:
        distinct = np.unique(old)
        if len(distinct) * share_at <= len(old):
            old, where = distinct, np.searchsorted(distinct, old)
    c, reads = len(old), int(is_old.sum())
    local = flat + (c - start)
    local[is_old] = where[:reads]
    loss_local = losses + (c - start)
    loss_local[losses < start] = where[reads:]
    return old, local, loss_local


@pytest.mark.parametrize("seed", range(12))
def test_localise_matches_the_sorted_oracle(seed: int) -> None:
    """Dense ranges of earlier nodes (marks), sparse ones (sort), shared or not; the
    compiled ``localise_reads`` (what ``run_programs`` calls) and its Python twin."""
    from edbatch.api._bulk_scan import localise_reads
    from edbatch.api._rounds import localise
    rng = np.random.default_rng(seed)
    start = int(rng.integers(5, 400))
    lo = int(rng.integers(0, start))
    reads = int(rng.integers(0, 3 * (start - lo) + 4))
    flat = np.concatenate([rng.integers(lo, start, reads),
                           rng.integers(start, start + 50, int(rng.integers(0, 30)))])
    rng.shuffle(flat)
    losses = rng.integers(0 if seed % 2 else start, start + 50, int(rng.integers(0, 6)))
    for share_at in (1, 2, 3):
        want = _localise_sorted(flat.copy(), losses.copy(), start, share_at)
        for got in (localise(flat.copy(), losses.copy(), start, share_at),
                    localise_reads(flat.copy(), losses.copy(), start, share_at)):
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g, w)


def test_lookups_go_cold_after_misses_in_a_row_and_a_probe_hit_warms_them() -> None:
    lru: Lru[int] = Lru(4)
    for i in range(COLD_AFTER):
        assert not lru.cold() and lru.get((i,)) is None
    misses = lru.misses
    skips = [lru.cold() for _ in range(PROBE_EVERY)]  # every PROBE_EVERY-th still looks
    assert skips == [True] * (PROBE_EVERY - 1) + [False]
    assert lru.misses - misses == PROBE_EVERY - 1  # a skipped lookup counts as a miss
    lru.put(("x",), 1)
    assert lru.get(("x",)) == 1 and not lru.cold()  # a hit: lookups again
