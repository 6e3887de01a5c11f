"""Compiled bodies of the module network's attention segments
(:mod:`edbatch.executor.cells_module_net_segment`): :func:`segment_forward` runs a segment's batches
in schedule order on the attention and scene arenas, :func:`segment_backward` their backwards in
reverse order into the gradient arenas and a flat parameter-gradient vector.

A segment's table has one row per batch: ``(code, first output row, rows, operand 0's offset
in rows, operand 1's offset, parameter offset)``, an operand that is a view of the arena as
``-(its first row + 1)``; codes as
:data:`~edbatch.executor.cells_module_net_segment.CODES` (0 scene, 1 filter, 2 relate,
3 unique, 4 union, 5 intersect, 6 same). Same equations as the cell kinds of
:mod:`edbatch.executor.cells_module_net`; the sigmoid is :mod:`edbatch.executor._fused`'s.

**Zero skips** (the padded objects of a scene: its mask column and attention 0): a term whose
factor is 0 is not computed, its value (0, or ``x + 0``) kept exactly, not approximated: the
forward's filter projects only objects with attention, relate and same sum only over objects
``i`` with attention into objects ``j`` with a mask (a masked ``j`` outputs ``0 * mask``);
the backward routes a projection gradient only where it is not 0 and skips same's ``d M``,
``d f_i`` of an object with no attention (its ``d A_i`` is 0). Finite inputs give the
values of the full loops (``tests/executor/test_module_net_segment.py``).
"""

from __future__ import annotations

import numpy as np

from edbatch.executor._fused import _jit, _sigmoid

__all__ = ["segment_backward", "segment_forward"]


# ---------------------------------------------------------------------- compiled bodies
@_jit
def _row(rows, o, r):  # type: ignore[no-untyped-def]
    """Row ``r`` of an operand: ``rows[o + r]`` (a gather), ``-o - 1 + r`` (a view, ``o < 0``)."""
    return rows[o + r] if o >= 0 else r - o - 1


@_jit
def _proj(scene, srow, params, po, n, f, proj):  # type: ignore[no-untyped-def]
    """``proj_j = f_j . params[po:po + f]`` (filter's ``w``, relate's ``u``)."""
    for j in range(n):
        z = 0.0
        for k in range(f):
            z += scene[srow, j * f + k] * params[po + k]
        proj[j] = z


@_jit
def _proj_where(scene, srow, params, po, n, f, proj, att, arow):  # type: ignore[no-untyped-def]
    """:func:`_proj` for the objects ``j`` with ``att[arow, j] != 0`` (the others: 0)."""
    for j in range(n):
        z = 0.0
        if att[arow, j] != 0.0:
            for k in range(f):
                z += scene[srow, j * f + k] * params[po + k]
        proj[j] = z


@_jit
def _fm_row(scene, srow, params, po, f, fm, i):  # type: ignore[no-untyped-def]
    """same: ``fm_i = f_i^T M`` (``M``: ``params[po:po + f * f]`` row-major)."""
    for b in range(f):
        fm[i, b] = 0.0
    for a in range(f):
        fa = scene[srow, i * f + a]
        if fa == 0.0:  # (a one-hot's zeros, a padded object's row: terms exactly 0)
            continue
        for b in range(f):
            fm[i, b] += fa * params[po + a * f + b]


@_jit
def _same_sig(fm, i, scene, srow, j, f, c):  # type: ignore[no-untyped-def]
    """same: ``sig(fm_i . f_j + c)``."""
    z = 0.0
    for b in range(f):
        z += fm[i, b] * scene[srow, j * f + b]
    return _sigmoid(z + c)


@_jit
def _pair_sums_fwd(att, arow, proj, c, scene, srow, n, f, t):  # type: ignore[no-untyped-def]
    """The forward's relate sums: ``t_j = sum_i att_i sig(proj_j - proj_i + c)`` over ``i != j``
    with ``att_i != 0``, for ``j`` with a mask (else ``t_j = 0``; nothing stored)."""
    for j in range(n):
        t[j] = 0.0
    for i in range(n):
        ai = att[arow, i]
        if ai == 0.0:
            continue
        for j in range(n):
            if i != j and scene[srow, j * f] != 0.0:
                t[j] += ai * _sigmoid(proj[j] - proj[i] + c)


@_jit
def _same_sums_fwd(att, arow, scene, srow, params, po, n, f, fm, t):  # type: ignore[no-untyped-def]
    """The forward's same sums: :func:`_same_sums` over ``i`` with ``att_i != 0`` into ``j``
    with a mask (else ``t_j = 0``; ``sg`` not stored)."""
    c = params[po + f * f]
    for j in range(n):
        t[j] = 0.0
    for i in range(n):
        ai = att[arow, i]
        if ai == 0.0:
            continue
        _fm_row(scene, srow, params, po, f, fm, i)
        for j in range(n):
            if i != j and scene[srow, j * f] != 0.0:
                t[j] += ai * _same_sig(fm, i, scene, srow, j, f, c)


@_jit
def _pair_sums(att, arow, proj, c, n, sg, t):  # type: ignore[no-untyped-def]
    """relate: ``sg_ij = sig(proj_j - proj_i + c)`` (0 on the diagonal), ``t = att sg``."""
    for j in range(n):
        t[j] = 0.0
    for i in range(n):
        ai = att[arow, i]
        for j in range(n):
            v = 0.0 if i == j else _sigmoid(proj[j] - proj[i] + c)
            sg[i, j] = v
            t[j] += ai * v


@_jit
def _same_sums(att, arow, scene, srow, params, po, n, f, fm, sg, t):  # type: ignore[no-untyped-def]
    """same: ``fm_i = f_i^T M``, ``sg_ij = sig(fm_i . f_j + c)`` (0 on the diagonal),
    ``t = att sg`` (``M``: ``params[po:po + f * f]`` row-major, then ``c``)."""
    c = params[po + f * f]
    for i in range(n):
        _fm_row(scene, srow, params, po, f, fm, i)
    for j in range(n):
        t[j] = 0.0
    for i in range(n):
        ai = att[arow, i]
        for j in range(n):
            v = 0.0 if i == j else _same_sig(fm, i, scene, srow, j, f, c)
            sg[i, j] = v
            t[j] += ai * v


@_jit
def _same_grad(att, a_row, gatt, dst, scene, srow, params, po, n, f, fm, sg, d_a, pgrad,
               gscene):  # type: ignore[no-untyped-def]
    """same's backward (after :func:`_same_sums`): ``d att``, ``d M``, ``d c``, ``d f``."""
    dc = 0.0
    for i in range(n):
        ai, da = att[a_row, i], 0.0
        for b in range(f):
            d_a[b] = 0.0
        for j in range(n):
            d_t = gatt[dst, j] * scene[srow, j * f]
            v = sg[i, j]
            da += v * d_t
            ds = ai * d_t * (v * (1.0 - v))
            if ds != 0.0:
                dc += ds
                for b in range(f):  # A_i = sum_j ds_ij f_j; d f_j += ds_ij fm_i
                    d_a[b] += ds * scene[srow, j * f + b]
                    gscene[srow, j * f + b] += ds * fm[i, b]
        gatt[a_row, i] += da
        if ai == 0.0:  # d A_i = 0: nothing into d M, d f_i
            continue
        for a in range(f):  # d M += f_i A_i^T (f_ia = 0: nothing); d f_i += M A_i
            fa, acc = scene[srow, i * f + a], 0.0
            if fa != 0.0:
                for b in range(f):
                    pgrad[po + a * f + b] += fa * d_a[b]
            for b in range(f):
                acc += params[po + a * f + b] * d_a[b]
            gscene[srow, i * f + a] += acc
    pgrad[po + f * f] += dc


@_jit
def segment_forward(table, rows, att, scene, params):  # type: ignore[no-untyped-def]
    n = att.shape[1]
    f = scene.shape[1] // n
    proj, t = np.empty(n, dtype=att.dtype), np.empty(n, dtype=att.dtype)
    fm = np.empty((n, f), dtype=att.dtype)
    for s in range(table.shape[0]):
        code, dst0, size = table[s, 0], table[s, 1], table[s, 2]
        o0, o1, po = table[s, 3], table[s, 4], table[s, 5]
        for r in range(size):
            dst, a_row, b_row = dst0 + r, _row(rows, o0, r), _row(rows, o1, r)
            if code == 0:  # scene: the mask column (operand 0 is the scene)
                for j in range(n):
                    att[dst, j] = scene[a_row, j * f]
            elif code == 1:  # filter: att * sig(f w + b) (att 0: 0, not projected)
                _proj_where(scene, b_row, params, po, n, f, proj, att, a_row)
                for j in range(n):
                    a = att[a_row, j]
                    att[dst, j] = a * _sigmoid(proj[j] + params[po + f]) if a != 0.0 else a
            elif code == 2:  # relate: mask_j sum_i att_i sg_ij
                _proj(scene, b_row, params, po, n, f, proj)
                _pair_sums_fwd(att, a_row, proj, params[po + f], scene, b_row, n, f, t)
                for j in range(n):
                    att[dst, j] = t[j] * scene[b_row, j * f]
            elif code == 6:  # same: mask_j sum_i att_i sig(f_i M f_j + c)
                _same_sums_fwd(att, a_row, scene, b_row, params, po, n, f, fm, t)
                for j in range(n):
                    att[dst, j] = t[j] * scene[b_row, j * f]
            else:
                _plain_forward(att, code, dst, a_row, b_row, n)


@_jit
def _plain_forward(att, code, dst, a_row, b_row, n):  # type: ignore[no-untyped-def]
    """unique ``att / (sum att + 1e-3)``, union ``a + b - a b``, intersect ``a b``."""
    if code == 3:
        den = 0.0
        for j in range(n):
            den += att[a_row, j]
        den += 1e-3
        for j in range(n):
            att[dst, j] = att[a_row, j] / den
        return
    for j in range(n):
        a, b = att[a_row, j], att[b_row, j]
        att[dst, j] = (a + b) - a * b if code == 4 else a * b


@_jit
def segment_backward(table, rows, att, scene, params, gatt, gscene, pgrad):  # type: ignore[no-untyped-def]
    n = att.shape[1]
    f = scene.shape[1] // n
    proj, t = np.empty(n, dtype=att.dtype), np.empty(n, dtype=att.dtype)
    sg, fm = np.empty((n, n), dtype=att.dtype), np.empty((n, f), dtype=att.dtype)
    d_proj, d_a = np.empty(n, dtype=att.dtype), np.empty(f, dtype=att.dtype)
    for s in range(table.shape[0] - 1, -1, -1):
        code, dst0, size = table[s, 0], table[s, 1], table[s, 2]
        o0, o1, po = table[s, 3], table[s, 4], table[s, 5]
        for r in range(size):
            dst, a_row, b_row = dst0 + r, _row(rows, o0, r), _row(rows, o1, r)
            if code == 0:
                for j in range(n):
                    gscene[a_row, j * f] += gatt[dst, j]
            elif code == 1:
                _proj(scene, b_row, params, po, n, f, proj)
                db = 0.0
                for j in range(n):
                    v, g = _sigmoid(proj[j] + params[po + f]), gatt[dst, j]
                    gatt[a_row, j] += g * v
                    d_proj[j] = g * att[a_row, j] * (v * (1.0 - v))
                    db += d_proj[j]
                _proj_grad(scene, b_row, params, po, n, f, d_proj, pgrad, gscene)
                pgrad[po + f] += db
            elif code == 2:
                _proj(scene, b_row, params, po, n, f, proj)
                _pair_sums(att, a_row, proj, params[po + f], n, sg, t)
                pgrad[po + f] += _relate_grad(att, a_row, gatt, dst, scene, b_row, f, sg,
                                              d_proj)
                _proj_grad(scene, b_row, params, po, n, f, d_proj, pgrad, gscene)
                for j in range(n):
                    gscene[b_row, j * f] += gatt[dst, j] * t[j]
            elif code == 6:
                _same_sums(att, a_row, scene, b_row, params, po, n, f, fm, sg, t)
                _same_grad(att, a_row, gatt, dst, scene, b_row, params, po, n, f, fm, sg, d_a,
                           pgrad, gscene)
                for j in range(n):
                    gscene[b_row, j * f] += gatt[dst, j] * t[j]
            else:
                _plain_backward(att, gatt, code, dst, a_row, b_row, n)


@_jit
def _relate_grad(att, a_row, gatt, dst, scene, srow, f, sg, d_proj):  # type: ignore[no-untyped-def]
    """relate: ``d att`` added into ``gatt``, ``d proj`` into ``d_proj``; returns ``d c``."""
    n = att.shape[1]
    dc = 0.0
    for j in range(n):
        d_proj[j] = 0.0
    for i in range(n):
        ai, da = att[a_row, i], 0.0
        for j in range(n):
            d_t = gatt[dst, j] * scene[srow, j * f]
            v = sg[i, j]
            da += v * d_t
            ds = ai * d_t * (v * (1.0 - v))
            dc += ds
            d_proj[j] += ds
            d_proj[i] -= ds
        gatt[a_row, i] += da
    return dc


@_jit
def _proj_grad(scene, srow, params, po, n, f, d_proj, pgrad, gscene):  # type: ignore[no-untyped-def]
    """Through ``proj_j = f_j . v``: ``d v += sum_j d_j f_j``, ``d f_j += d_j v``."""
    for j in range(n):
        dp = d_proj[j]
        if dp == 0.0:  # (a padded object: no attention, or no mask)
            continue
        for k in range(f):
            pgrad[po + k] += dp * scene[srow, j * f + k]
            gscene[srow, j * f + k] += dp * params[po + k]


@_jit
def _plain_backward(att, gatt, code, dst, a_row, b_row, n):  # type: ignore[no-untyped-def]
    if code == 3:
        den, gy = 0.0, 0.0
        for j in range(n):
            den += att[a_row, j]
            gy += gatt[dst, j] * att[dst, j]
        den += 1e-3
        for j in range(n):
            gatt[a_row, j] += (gatt[dst, j] - gy) / den
        return
    for j in range(n):
        g, a, b = gatt[dst, j], att[a_row, j], att[b_row, j]
        if code == 4:
            gatt[a_row, j] += g - g * b
            gatt[b_row, j] += g - g * a
        else:
            gatt[a_row, j] += g * b
            gatt[b_row, j] += g * a
