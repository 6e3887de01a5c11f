"""Peers of the ``ggnn_molecules`` workload: the same GGNN, loss and parameters, in plain
PyTorch one molecule at a time (the seeds' unbatched baseline) and in PyTorch Geometric
(the practitioner's choice: one disjoint-union batch, ``MessagePassing`` with ``add``
aggregation and ``global_add_pool``).

Both read the parameter dict of :func:`edbatch.executor.init_params` by name and the
molecules as :class:`~edbatch.workloads.ggnn_molecules.MoleculeInstance` (atom codes,
incoming messages, coded target), and return the summed loss of a mini-batch, the value of
its ``loss_sum`` node in edbatch (``tests/workloads/test_ggnn_molecules.py`` checks the
equality in fp64). The equations are in :mod:`edbatch.workloads.ggnn_molecules`; here
messages are computed per directed edge, as PyG does (edbatch computes one per source atom
and bond type: the same values).

Nothing here is timed; PyG is the optional ``peers`` extra (``pip install torch-geometric``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.data.molecules import BOND_TYPES
from edbatch.workloads.ggnn_molecules import (
    TARGET_SCALE,
    GGNNMolecules,
    MoleculeInstance,
    unpack_atom,
)

__all__ = ["pyg_loss", "unbatched_loss"]

P = "ggnn"


def _embed(inst: MoleculeInstance, params: Mapping[str, Tensor]) -> Tensor:
    rows = torch.tensor([unpack_atom(c) for c in inst.atom_codes], dtype=torch.int64,
                        device=params[f"{P}.atom_emb"].device)
    return F.embedding(rows, params[f"{P}.atom_emb"]).sum(dim=1)


def _edges(insts: Sequence[MoleculeInstance], device: torch.device
           ) -> tuple[Tensor, Tensor, Tensor]:
    """``(src, dst, bond type)`` of every directed edge, atoms numbered over ``insts``."""
    src, dst, kind, base = [], [], [], 0
    for inst in insts:
        for v, incoming in enumerate(inst.sources):
            for u, t in incoming:
                src.append(base + u)
                dst.append(base + v)
                kind.append(t)
        base += inst.n_atoms
    as_t = [torch.tensor(x, dtype=torch.int64, device=device) for x in (src, dst, kind)]
    return as_t[0], as_t[1], as_t[2]


def _gru(a: Tensor, h: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    hidden = h.shape[1]
    rz = torch.sigmoid(F.linear(torch.cat([a, h], 1), params[f"{P}.gru.rz"],
                                params[f"{P}.gru.rz.b"]))
    r, z = rz[:, :hidden], rz[:, hidden:]
    c = torch.tanh(F.linear(torch.cat([a, r * h], 1), params[f"{P}.gru.c"],
                            params[f"{P}.gru.c.b"]))
    return z * h + (1.0 - z) * c


def _terms(h: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    gate = torch.sigmoid(F.linear(h, params[f"{P}.gate"], params[f"{P}.gate.b"]))
    return gate * torch.tanh(F.linear(h, params[f"{P}.proj"], params[f"{P}.proj.b"]))


def _sq_err(g: Tensor, target_codes: Sequence[int], params: Mapping[str, Tensor]) -> Tensor:
    hid = torch.tanh(F.linear(g, params[f"{P}.hid"], params[f"{P}.hid.b"]))
    pred = F.linear(hid, params[f"{P}.pred"], params[f"{P}.pred.b"]).squeeze(1)
    z = torch.tensor(target_codes, dtype=pred.dtype, device=pred.device) / TARGET_SCALE
    return (pred - z) ** 2


def _messages(h: Tensor, src: Tensor, kind: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    """``A_b h_src + c_b`` per directed edge."""
    out = h.new_zeros(len(src), h.shape[1])
    for t, bond in enumerate(BOND_TYPES):
        sel = torch.nonzero(kind == t).reshape(-1)
        if len(sel):
            out[sel] = F.linear(h[src[sel]], params[f"{P}.msg.{bond}"],
                                params[f"{P}.msg.{bond}.b"])
    return out


def unbatched_loss(workload: GGNNMolecules, insts: Sequence[MoleculeInstance],
                   params: Mapping[str, Tensor]) -> Tensor:
    """Summed loss, one molecule at a time (per-molecule tensors, a Python loop over them)."""
    total = None
    for inst in insts:
        h = _embed(inst, params)
        src, dst, kind = _edges([inst], h.device)
        for _ in range(workload.rounds):
            a = h.new_zeros(h.shape).index_add(0, dst, _messages(h, src, kind, params))
            h = _gru(a, h, params)
        g = _terms(h, params).sum(dim=0, keepdim=True)
        loss = _sq_err(g, [inst.target_code], params).sum()
        total = loss if total is None else total + loss
    assert total is not None
    return total


def pyg_loss(workload: GGNNMolecules, insts: Sequence[MoleculeInstance],
             params: Mapping[str, Tensor]) -> Tensor:
    """Summed loss of one PyG batch (``Batch.from_data_list`` of the molecules)."""
    from torch_geometric.data import Batch, Data
    from torch_geometric.nn import MessagePassing, global_add_pool

    class TypedMessages(MessagePassing):  # type: ignore[misc]
        """``a_v = sum_{(u, v, b)} A_b h_u + c_b`` (``add`` aggregation)."""

        def __init__(self) -> None:
            super().__init__(aggr="add", node_dim=0)

        def forward(self, h: Tensor, edge_index: Tensor, edge_type: Tensor) -> Tensor:
            return self.propagate(edge_index, h=h, edge_type=edge_type)  # type: ignore[no-any-return]

        def message(self, h_j: Tensor, edge_type: Tensor) -> Tensor:
            return _messages(h_j, torch.arange(len(h_j), device=h_j.device), edge_type,
                             params)

    device = params[f"{P}.atom_emb"].device
    data = []
    for inst in insts:
        src, dst, kind = _edges([inst], device)
        data.append(Data(x=torch.tensor([unpack_atom(c) for c in inst.atom_codes],
                                        dtype=torch.int64, device=device).reshape(-1, 6),
                         edge_index=torch.stack([src, dst]), edge_type=kind,
                         num_nodes=inst.n_atoms))
    batch = Batch.from_data_list(data)
    conv = TypedMessages()
    h = F.embedding(batch.x, params[f"{P}.atom_emb"]).sum(dim=1)
    for _ in range(workload.rounds):
        h = _gru(conv(h, batch.edge_index, batch.edge_type), h, params)
    g = global_add_pool(_terms(h, params), batch.batch, size=len(insts))
    return _sq_err(g, [inst.target_code for inst in insts], params).sum()
