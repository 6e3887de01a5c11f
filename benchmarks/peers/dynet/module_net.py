"""The DyNet peer of ``module_net`` (:mod:`benchmarks.dynet_peer`): IEP's execution engine
over CLEVR programs on scene graphs, written per question as a DyNet user writes it.

Per question: each object's row ``[1, one-hot attributes, E-sum, x, y]`` (``dy.inputVector``
for the constant parts, ``dy.esum`` of four ``dy.lookup``\\ s, ``dy.concatenate``); the
scene is the ``F x N`` matrix of its rows padded with ``dy.zeros`` columns to ``N`` objects
(``dy.concatenate_cols``; fixed shapes, so DyNet's autobatching can batch a module across
questions, as IEP's fixed-size feature maps do); then one DyNet expression per program step,
in program order: ``filter`` ``cmult(att, logistic(S^T w + b))``, ``relate`` / ``same`` the
pair scores (outer products / ``S^T M S``) through ``logistic``, masked by a constant
off-diagonal, ``query`` ``tanh(affine(W, S att))``, ``count`` the Gaussian bins of
``sum_elems(att)``, the comparisons on ``concatenate([x, y, cmult(x, y)])``; the answer's
``pickneglogsoftmax``, one ``dy.esum`` per mini-batch. Equations and parameter values are
exactly edbatch's (:mod:`edbatch.workloads.module_net`). Torch-free (the DyNet worker does
not import torch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from edbatch.data.clevr_programs import module_type
from edbatch.workloads.module_net import (
    ATTRIBUTE_ROWS,
    COUNT_BINS,
    MAX_OBJECTS,
    VOCAB_SIZES,
    unpack_object,
)

__all__ = ["LOOKUPS", "loss"]

_P = "module_net"
N = MAX_OBJECTS
#: Parameters held as DyNet lookup tables.
LOOKUPS = (f"{_P}.object.E",)
_OFFSETS = np.cumsum((0, *VOCAB_SIZES[:-1]))


def _pairs(dy: Any, att: Any, score: Any, mask: Any, off: Any) -> Any:
    """``out_j = mask_j sum_{i != j} att_i sig(score_ij)``."""
    return dy.cmult(dy.transpose(dy.cmult(dy.logistic(score), off)) * att, mask)


def _module(dy: Any, fn: str, p: Callable[[str], Any], args: list[Any], scene: Any,
            mask: Any, const: dict[str, Any]) -> Any:
    """One program step: module function ``fn`` with its parameters ``p(name)``."""
    if fn == "scene":
        return mask
    if fn.startswith("filter_"):
        return dy.cmult(args[0], dy.logistic(dy.transpose(scene) * p("w") + p("b")))
    if fn == "relate":
        proj = dy.transpose(scene) * p("u")  # (N,): u . f_j
        ones = const["ones"]
        score = ones * dy.transpose(proj) - proj * dy.transpose(ones) + p("c")
        return _pairs(dy, args[0], score, mask, const["off"])
    if fn.startswith("same_"):
        score = dy.transpose(scene) * p("M") * scene + p("c")
        return _pairs(dy, args[0], score, mask, const["off"])
    if fn == "unique":
        return dy.cdiv(args[0], dy.sum_elems(args[0]) + 1e-3)
    if fn == "union":
        return args[0] + args[1] - dy.cmult(args[0], args[1])
    if fn == "intersect":
        return dy.cmult(args[0], args[1])
    if fn in ("count", "exist"):
        k = dy.exp(dy.square(dy.sum_elems(args[0]) - const["bins"]) * -2.0)
        return dy.tanh(dy.affine_transform([p("b"), p("W"), k]))
    if fn.startswith("query_"):
        return dy.tanh(dy.affine_transform([p("b"), p("W"), scene * args[0]]))
    if fn == "equal_object":
        return dy.tanh(dy.affine_transform([p("b"), p("W"), dy.dot_product(*args)]))
    x, y = args  # equal_*, less_than, greater_than
    return dy.tanh(dy.affine_transform([p("b"), p("W"),
                                        dy.concatenate([x, y, dy.cmult(x, y)])]))


def _scene(dy: Any, table: Any, codes: Sequence[int], width: int) -> tuple[Any, Any]:
    """``(F x N scene matrix, mask)`` of one question's objects."""
    cols = []
    for code in codes:
        attrs, x, y = unpack_object(code)
        idx = _OFFSETS + np.asarray(attrs)
        hot = np.zeros(1 + ATTRIBUTE_ROWS)
        hot[0], hot[1 + idx] = 1.0, 1.0
        cols.append(dy.concatenate([dy.inputVector(hot), dy.esum([dy.lookup(table, int(i))
                                                                  for i in idx]),
                                    dy.inputVector([x, y])]))
    n = len(cols)
    cols += [dy.zeros(width)] * (N - n)
    return dy.concatenate_cols(cols), dy.inputVector([1.0] * n + [0.0] * (N - n))


def loss(dy: Any, p: dict[str, Any], hid: int, batch: Sequence[Any]) -> Any:
    """Build the module networks of ``batch`` (``QuestionInstance``\\ s); return the summed
    answer cross-entropy."""
    dy.renew_cg()
    table = p[f"{_P}.object.E"]
    width = 3 + ATTRIBUTE_ROWS + table.shape()[1]
    const = {"off": dy.inputTensor(1.0 - np.eye(N)), "ones": dy.inputVector([1.0] * N),
             "bins": dy.inputVector(list(range(COUNT_BINS)))}
    w_ans, b_ans = p[f"{_P}.answer.W"], p[f"{_P}.answer.b"]
    losses = []
    for inst in batch:
        scene, mask = _scene(dy, table, inst.object_codes, width)
        done: list[Any] = []
        for node in inst.question.program:
            mtype = module_type(node)
            key = f"{_P}.{mtype.replace('[', '.').rstrip(']')}"
            done.append(_module(dy, mtype.split("[")[0], lambda n, k=key: p[f"{k}.{n}"],
                                [done[j] for j in node.inputs], scene, mask, const))
        losses.append(dy.pickneglogsoftmax(dy.affine_transform([b_ans, w_ans, done[-1]]),
                                           inst.answer))
    return dy.esum(losses)
