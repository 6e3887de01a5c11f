"""ED-Batch's agenda uses the exact mean remaining depth, ties to the lowest op id."""

from __future__ import annotations

from edbatch.graph import GraphBuilder, OpType, Vocab
from edbatch.schedule import AgendaPolicy, run_policy


def test_agenda_exact_mean_breaks_ties_to_the_lowest_type_id() -> None:
    # After the lookups, f (id 1: depths 1, 2, 3) and g (id 2: depths 1, 3) are both ready
    # with the same mean remaining depth 2. The exact mean ties and takes f; DyNet's
    # sum / (count + 1e-3) gives f 6/3.001 > g 4/2.001 and would take g.
    vocab = Vocab([OpType("x", "lookup", (), (1,)), OpType("f", "tanh", ((1,),), (1,)),
                   OpType("g", "tanh", ((1,),), (1,))])
    b = GraphBuilder(vocab)
    x1, x2 = b.add("x"), b.add("x")
    f1 = b.add("f", x1)
    f2 = b.add("f", f1)
    b.add("f", f2)
    b.add("g", x2)
    b.add("g", f2)
    sched = run_policy(b.build(), AgendaPolicy())
    assert [vocab[b.op_id].name for b in sched.batches[:2]] == ["x", "f"]
