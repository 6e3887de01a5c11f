"""Cell kinds of the SICK relatedness workload: a variadic child-sum Tree-LSTM node and
the similarity head of Tai et al. (2015) with its KL loss.

The equations are in :mod:`edbatch.workloads.tree_lstm_sick`. Both
:class:`~edbatch.executor.cell_kind.CellKind` subclasses read their parameters by their
declared names and has a hand-written backward, so training runs the executor's
analytic path (:mod:`edbatch.executor._analytic`). The word
embedding table ``tree_lstm_sick.E`` is read by the built-in ``lookup`` kind
(:class:`~edbatch.executor.cells.Lookup`, ``init="embedding"``).

**Variadic node.** ``tree_lstm_sick.node`` has ``in_shapes=None``: operand 0 is the word
embedding ``x`` (every node has it), operands ``1..k`` the ``[h; c]`` states of its ``k``
children, and the node's attr is ``k``. The batched executor reads slot ``j`` of a batch as
the ``j``-th operand of the nodes that *have* one, in the batch's row order (see
:meth:`edbatch.memory.plan.MemoryPlan`; the user API's variadic cells rely on the same
contract), so child slot ``j`` holds the rows of the nodes whose attr is ``> j``. The kernel
rebuilds that row-to-node map from the attrs and reduces per node with ``index_add``; the
reference executor (one node at a time) passes the same layout with ``B = 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor import _fused, _fused_sick
from edbatch.executor._attr_checks import check_range, check_slot_counts
from edbatch.executor._weights import TRANSPOSED, linear_t
from edbatch.executor.cell_kind import CellKind, Param, RoleGrads
from edbatch.executor.cells import SIGMOID_GRAD
from edbatch.executor.cells_trees import _gates_backward
from edbatch.executor.kernels import fast_tanh, slot_nodes, untracked
from edbatch.graph import OpType

__all__ = ["SCORE_SCALE", "SickNode", "SickSim", "child_rows", "score_target",
           "similarity_probs", "stacked_weights", "tree_lstm_sick_node", "tree_lstm_sick_sim"]

#: A pair's gold score travels as the attr ``round(score * SCORE_SCALE)`` (SICK scores have
#: at most three decimals, so this is exact).
SCORE_SCALE = 1000


def child_rows(inputs: Sequence[Tensor], counts: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """Every child state of a batch as ``[N, width]`` rows and the node each belongs to.

    ``inputs[j]`` holds the ``j``-th child of every node whose count is ``> j``.
    """
    if not inputs:
        return counts.new_zeros((0, width), dtype=torch.get_default_dtype()), counts.new_zeros(0)
    rows = torch.cat(list(inputs)) if len(inputs) > 1 else inputs[0]
    sizes = [t.shape[0] for t in inputs]
    if counts.device.type == "cpu":  # (elsewhere unchecked: no host sync)
        check_slot_counts(counts, sizes)
    segment = torch.cat(slot_nodes(counts, sizes))
    return rows, segment


class SickNode(CellKind):
    """Child-sum Tree-LSTM node (Tai et al. 2015, eq. 2-8) over any number of children.

    ``h~ = sum_k h_k``; ``[i; o; u] = W_iou x + U_iou h~ + b_iou``;
    ``f_k = sigmoid(W_f x + U_f h_k + b_f)``; ``c = sigmoid(i)*tanh(u) + sum_k f_k*c_k``;
    ``h = sigmoid(o)*tanh(c)``; returns ``[h; c]``. Variadic: operand 0 is ``x``, then
    the children's states (see the module doc). Hand backward: the gate gradients of the
    binary Tree-LSTM (:func:`~edbatch.executor.cells_trees._gates_backward`), then the
    forget gates per child row, summed per node with ``index_add``.
    """

    kind = "tree_lstm_sick.node"
    params = (Param("W_iou", "3H, D"), Param("b_iou", "3H"), Param("U_iou", "3H, H"),
              Param("W_f", "H, D"), Param("b_f", "H"), Param("U_f", "H, H"))
    saves = ("x", "io", "u", "t", "h_sum", "rows", "segment", "f", "sizes", "w_t")
    dims = staticmethod(lambda op: {"H": op.out_shape[0] // 2})
    counts_attr = (1, 0)  # the attr: the node's child count

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Any] | None = None) -> Tensor:
        x = inputs[0]
        batch, hidden = x.shape[0], p.U_f.shape[0]
        h_sum = rows = segment = f = fc = w_t = None
        if len(inputs) > 1:  # leaves only (a schedule's first node batch): h~ = 0, no f_k
            rows, segment = child_rows(inputs[1:], attrs, 2 * hidden)
            rows = rows.to(x.dtype)
            h_k, c_k = rows[:, :hidden], rows[:, hidden:]
            # summed as whole [h; c] rows: index_add over a column half is ~3x slower
            h_sum = x.new_zeros(batch, 2 * hidden).index_add_(0, segment, rows)[:, :hidden]
            w_t, bias = stacked_weights(p.W_iou, p.W_f, p.b_iou, p.b_f)  # one GEMM:
            # [W_iou; W_f] x (about 2x faster than two at B 100)
            gw = torch.addmm(bias, x, w_t)
            g = gw[:, :3 * hidden].addmm_(h_sum, p.U_iou.t())  # in place: no [B, 3H] copy
            f = gw[:, 3 * hidden:].index_select(0, segment).addmm_(h_k, p.U_f.t())
        else:
            gw = g = linear_t(x, p.W_iou, p.b_iou)
        if untracked(x, *inputs[1:], *p) and _fused.usable(gw, rows if rows is not None
                                                           else gw, *(() if out is None
                                                                      else (out,))):
            return self._fused(gw, f, rows, segment, out, save, x=x, h_sum=h_sum,
                               sizes=[s.shape[0] for s in inputs[1:]], w_t=w_t)
        if f is not None:
            f = f.sigmoid_() if untracked(x, *inputs[1:], *p) else torch.sigmoid(f)
            fc = x.new_zeros(batch, hidden).index_add_(0, segment, f * c_k)
        io = torch.sigmoid(g[:, :2 * hidden])
        u = fast_tanh(g[:, 2 * hidden:])
        if out is None or not untracked(x, *inputs[1:], *p):
            c = io[:, :hidden] * u
            if fc is not None:
                c = c + fc
            t = fast_tanh(c)
            y = torch.cat([io[:, hidden:] * t, c], dim=1, out=out)
        else:  # the same arithmetic, c and h written straight into ``out``
            c = torch.mul(io[:, :hidden], u, out=out[:, hidden:])
            if fc is not None:
                c.add_(fc)
            t = fast_tanh(c)
            torch.mul(io[:, hidden:], t, out=out[:, :hidden])
            y = out
        if save is not None:
            save.update(x=x, io=io, u=u, t=t, h_sum=h_sum, rows=rows, segment=segment, f=f,
                        sizes=[s.shape[0] for s in inputs[1:]], w_t=w_t)
        return y

    @staticmethod
    def _fused(gw: Tensor, f: Tensor | None, rows: Tensor | None, segment: Tensor | None,
               out: Tensor | None, save: dict[str, Any] | None, **saves: Any) -> Tensor:
        """The element-wise part as one compiled kernel (:func:`_fused_sick.sick_forward
        <edbatch.executor._fused_sick.sick_forward>`); saves what the backward reads (``io``: all
        of ``gw``, as the binary Tree-LSTM's fused forward)."""
        batch, hidden = gw.shape[0], gw.shape[1] // (3 if f is None else 4)
        if out is None:
            out = gw.new_empty(batch, 2 * hidden)
        if f is None:  # leaves: no child rows
            f, rows = gw.new_empty(0, hidden), gw.new_empty(0, 2 * hidden)
            segment = torch.empty(0, dtype=torch.int64)
        t = gw.new_empty(batch, hidden)
        assert rows is not None and segment is not None
        rows = rows.contiguous()  # (saved so: the fused backward reads it as it is)
        _fused_sick.sick_forward(gw, f, rows, segment, out, t)
        if save is not None:
            save.update(io=gw, u=gw[:, 2 * hidden:3 * hidden], t=t, f=f if f.numel() else None,
                        rows=rows if rows.numel() else None,
                        segment=segment if segment.numel() else None, **saves)
        return out

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        x, u = saved.x, saved.u
        hidden = u.shape[1]
        if saved.io.shape[1] >= 3 * hidden and _fused.usable(  # a fused forward's saves
                grad, saved.io, saved.t, *(() if saved.segment is None else (saved.f,))):
            return self._fused_backward(saved, grad, p, grads)
        d_g, dc = _gates_backward(grad, saved.io, u, saved.t)
        grads.linear(("W_iou", "b_iou"), d_g, x)
        if saved.segment is None:
            return [d_g @ p.W_iou]
        segment, f, rows = saved.segment, saved.f, saved.rows
        grads.linear(("U_iou",), d_g, saved.h_sum)
        d_rows = torch.empty_like(rows)
        dc_k = dc.index_select(0, segment)
        torch.mul(dc_k, f, out=d_rows[:, hidden:])  # d c_k = dc * f_k
        d_f = dc_k.mul_(rows[:, hidden:])
        SIGMOID_GRAD(d_f, f, grad_input=d_f)
        grads.linear(("U_f",), d_f, rows[:, :hidden])
        d_gw = x.new_zeros(x.shape[0], 4 * hidden)  # [d g; d (W_f x)]
        d_gw[:, :3 * hidden] = d_g
        d_wf = d_gw[:, 3 * hidden:].index_add_(0, segment, d_f)
        grads.linear(("W_f", "b_f"), d_wf, x)
        dx = d_gw @ saved.w_t.t()
        # d h_k = (U_iou^T d g)[node of k] + U_f^T d f_k
        torch.addmm((d_g @ p.U_iou).index_select(0, segment), d_f, p.U_f,
                    out=d_rows[:, :hidden])
        return [dx, *d_rows.split(saved.sizes)]

    @staticmethod
    def _fused_backward(saved: Any, grad: Tensor, p: Any, grads: RoleGrads
                        ) -> list[Tensor | None]:
        """:meth:`backward`'s element-wise part as one compiled kernel
        (:func:`_fused_sick.sick_backward <edbatch.executor._fused_sick.sick_backward>`:
        gate gradients, ``d f_k``, ``d c_k`` and the per-node sums of ``d f_k``); the same
        matmuls."""
        x, hidden = saved.x, saved.u.shape[1]
        if saved.segment is None:
            d_g = x.new_empty(x.shape[0], 3 * hidden)
            _fused_sick.sick_backward(grad, saved.io, saved.t, d_g)
            grads.linear(("W_iou", "b_iou"), d_g, x)
            return [d_g @ p.W_iou]
        segment, f, rows = saved.segment, saved.f, saved.rows  # (contiguous: saved so)
        d_gw = x.new_empty(x.shape[0], 4 * hidden)  # [d g; d (W_f x)]
        d_f, d_rows = torch.empty_like(f), torch.empty_like(rows)
        _fused_sick.sick_backward(grad, saved.io, saved.t, d_gw,
                                  (f, rows, segment, d_f, d_rows))
        d_g = d_gw[:, :3 * hidden]
        grads.linear(("W_iou", "b_iou"), d_g, x)
        grads.linear(("U_iou",), d_g, saved.h_sum)
        grads.linear(("U_f",), d_f, rows[:, :hidden])
        grads.linear(("W_f", "b_f"), d_gw[:, 3 * hidden:], x)
        dx = d_gw @ saved.w_t.t()
        torch.addmm((d_g @ p.U_iou).index_select(0, segment), d_f, p.U_f,
                    out=d_rows[:, :hidden])
        return [dx, *d_rows.split(saved.sizes)]


def stacked_weights(w_iou: Tensor, w_f: Tensor, b_iou: Tensor, b_f: Tensor
                    ) -> tuple[Tensor, Tensor]:
    """``([W_iou; W_f]^T, [b_iou; b_f])``: contiguous, made once per executor run when
    autograd does not record the weights (kept in :data:`TRANSPOSED`'s run scope, so a
    weight updated between runs is never read stale; the node's kernel and its inference
    short path share it), else (autograd, or off the CPU as
    :func:`~edbatch.executor._weights.linear_t`) a fresh, differentiable copy."""
    bias = torch.cat([b_iou, b_f])
    entries = TRANSPOSED.entries
    if entries is None or not untracked(w_iou, w_f) or w_iou.device.type != "cpu":
        return torch.cat([w_iou, w_f]).t().contiguous(), bias
    key = (id(w_iou), -1 - id(w_f))  # no (weight, start) key of a transpose is negative
    hit = entries.get(key)
    if hit is None or hit[0] is not w_iou:
        hit = entries[key] = (w_iou, torch.cat([w_iou, w_f]).t().contiguous())
    return hit[1], bias


def similarity_probs(h_a: Tensor, h_b: Tensor, w_x: Tensor, w_abs: Tensor, b_s: Tensor,
                     w_p: Tensor, b_p: Tensor) -> Tensor:
    """Log-probabilities ``[B, 5]`` of the head: ``h_s = sigmoid(W_x (h_a*h_b) +
    W_abs |h_a - h_b| + b_s)``, ``log softmax(W_p h_s + b_p)``."""
    h_s = torch.sigmoid(F.linear(h_a * h_b, w_x, b_s) + F.linear((h_a - h_b).abs(), w_abs))
    return F.log_softmax(F.linear(h_s, w_p, b_p), dim=1)


def score_target(attrs: Tensor, classes: int, dtype: torch.dtype) -> Tensor:
    """The sparse target of :func:`edbatch.data.sick.similarity_target` from the attrs
    ``round(score * SCORE_SCALE)``: ``[B, classes]``, mass split between the two integer
    scores around the gold one (``ValueError`` on the CPU for a score outside
    ``1 .. classes``)."""
    check_range(attrs, classes * SCORE_SCALE + 1, "score attr", f"scores 1..{classes} x "
                f"{SCORE_SCALE}", f"its attr must be round(score * {SCORE_SCALE}), the score "
                f"in 1..{classes}", low=SCORE_SCALE)
    low = torch.div(attrs, SCORE_SCALE, rounding_mode="floor")
    frac = (attrs - low * SCORE_SCALE).to(dtype) / SCORE_SCALE
    target = torch.zeros(attrs.shape[0], classes + 1, dtype=dtype, device=attrs.device)
    rows = torch.arange(attrs.shape[0], device=attrs.device)
    target[rows, low - 1] = 1.0 - frac
    target[rows, low.clamp(max=classes)] += frac  # frac is 0 when low == classes
    return target[:, :classes]


class SickSim(CellKind):
    """``KL(t || p)`` per pair, ``[B, 1]``: ``p`` from :func:`similarity_probs` on the root
    ``h`` of both trees, ``t`` the sparse target of the gold score (attr). Reads only the
    ``h`` columns of both states (the executor's head reads); hand backward."""

    kind = "tree_lstm_sick.sim"
    inputs = ("a", "b")
    head_reads = ("a", "b")
    params = (Param("W_x", "S, H"), Param("W_abs", "S, H"), Param("b_s", "S"),
              Param("W_p", "C, S"), Param("b_p", "C"))
    saves = ("h_a", "h_b", "prod", "diff", "h_s", "logp", "target")
    dims = staticmethod(lambda op: {"H": op.in_shapes[0][0] // 2})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Any] | None = None) -> Tensor:
        hidden = p.W_x.shape[1]
        h_a, h_b = inputs[0][:, :hidden], inputs[1][:, :hidden]
        prod, diff = h_a * h_b, h_a - h_b
        h_s = torch.sigmoid(F.linear(prod, p.W_x, p.b_s) + F.linear(diff.abs(), p.W_abs))
        logp = F.log_softmax(F.linear(h_s, p.W_p, p.b_p), dim=1)
        target = score_target(attrs, logp.shape[1], logp.dtype)
        log_t = torch.where(target > 0, target, torch.ones_like(target)).log()
        if save is not None:
            save.update(h_a=h_a, h_b=h_b, prod=prod, diff=diff, h_s=h_s, logp=logp, target=target)
        return (target * (log_t - logp)).sum(dim=1, keepdim=True)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        target, h_s, diff = saved.target, saved.h_s, saved.diff
        # d/d logits of -sum_j t_j log softmax_j = p * sum(t) - t
        d_logits = (saved.logp.exp() * target.sum(1, keepdim=True) - target).mul_(grad)
        grads.linear(("W_p", "b_p"), d_logits, h_s)
        d_z = d_logits @ p.W_p
        SIGMOID_GRAD(d_z, h_s, grad_input=d_z)
        grads.linear(("W_x", "b_s"), d_z, saved.prod)
        grads.linear(("W_abs",), d_z, diff.abs())
        d_prod = d_z @ p.W_x
        d_diff = (d_z @ p.W_abs).mul_(diff.sign())
        return [torch.addcmul(d_diff, d_prod, saved.h_b),  # d h_a, d h_b (the h columns)
                torch.addcmul(d_diff.neg_(), d_prod, saved.h_a)]


#: The registered kernels, under the names they had as functions.
tree_lstm_sick_node, tree_lstm_sick_sim = SickNode.kernel, SickSim.kernel
