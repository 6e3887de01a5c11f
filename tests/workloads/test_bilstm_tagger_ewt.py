"""The plain BiLSTM tagger on EWT's UPOS tags (``data="ewt"``): real splits, same graphs."""

from __future__ import annotations

import pytest

from edbatch.data.ud import UPOS_TAGS
from edbatch.errors import UnknownNameError
from edbatch.workloads import make_workload


def test_ewt_splits_are_the_three_files() -> None:
    wl = make_workload("bilstm_tagger", data="ewt", embed_dim=4, hidden_dim=4)
    sizes = {s: len(wl.load(s)) for s in wl.splits}
    assert sizes == {"train": 12544, "dev": 2001, "test": 2077}
    assert wl.tag_names == UPOS_TAGS
    first = wl.load("train")[0]
    assert first.sentence.words[:3] == ("Al", "-", "Zaman")
    assert [UPOS_TAGS[t] for t in first.tag_ids[:3]] == ["PROPN", "PUNCT", "PROPN"]
    # the word vocabulary is train's: every train word has an id, some test words do not
    assert all(w for inst in wl.load("train") for w in inst.word_ids)
    assert any(w == 0 for inst in wl.load("test") for w in inst.word_ids)
    g = wl.minibatch("test", range(2))
    n = sum(len(inst) for inst in wl.load("test")[:2])
    assert g.num_nodes == 6 * n + 4 * 2 + 1


def test_default_data_is_unchanged_and_bad_data_is_named() -> None:
    assert make_workload("bilstm_tagger", embed_dim=4, hidden_dim=4).data == "wikiner"
    with pytest.raises(UnknownNameError, match="unknown data 'ewtt'.*Did you mean 'ewt'"):
        make_workload("bilstm_tagger", data="ewtt")
