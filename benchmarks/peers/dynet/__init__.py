"""The DyNet peers, one torch-free module per workload: ``benchmarks/peers/dynet/<name>.py``
defines ``loss`` and ``LOOKUPS`` (see :mod:`benchmarks.dynet_peer`), found by the workload's
registry name (:func:`benchmarks.peers.find_peers`)."""

from __future__ import annotations

from typing import Any

__all__ = ["lstm_step"]


def lstm_step(dy: Any, weight: Any, bias: Any, x: Any, h: Any, c: Any, hid: int
          ) -> tuple[Any, Any]:
    """``[i f o u] = W [x; h] + b``; ``c' = f*c + i*u``; ``h' = o*tanh(c')``."""
    g = dy.affine_transform([bias, weight, dy.concatenate([x, h])])
    i = dy.logistic(dy.pick_range(g, 0, hid))
    f = dy.logistic(dy.pick_range(g, hid, 2 * hid))
    o = dy.logistic(dy.pick_range(g, 2 * hid, 3 * hid))
    u = dy.tanh(dy.pick_range(g, 3 * hid, 4 * hid))
    c2 = dy.cmult(f, c) + dy.cmult(i, u)
    return dy.cmult(o, dy.tanh(c2)), c2
