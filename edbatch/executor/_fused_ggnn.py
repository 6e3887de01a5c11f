"""Fused element-wise bodies of the GGNN cells (:mod:`~edbatch.executor.cells_ggnn`).

As :mod:`~edbatch.executor._fused` does for the LSTM family: each function is one numba loop
over numpy views of the torch tensors (zero copy), row by row, with the same ``tanh`` and
``sigmoid`` (float32: the rational ``tanh``; float64: libm, so fused and unfused agree to
rounding; ``tests/workloads/test_ggnn_molecules.py`` checks both paths, gradients included).
The callers check :func:`~edbatch.executor._fused.usable` first; anything else (CUDA,
autograd recording, other dtypes) runs their torch code.

The GRU's blocks: ``P`` is ``[B, 3H]``, ``[r z | c]`` pre-activations in, activations out.
"""

from __future__ import annotations

import torch
from torch import Tensor

from edbatch.executor._fused import _jit, _jit_inline, _sigmoid, _tanh
from edbatch.executor._ggnn_checks import check_codes, check_counts

__all__ = ["BucketGrad", "bond_buckets", "bucket_sums", "bucket_sums_at", "compact_buckets",
           "embed_backward", "embed_forward", "gate_backward", "gate_forward", "gru_backward_c",
           "gru_backward_r", "gru_gates", "gru_output", "repeated_nodes", "scatter_messages"]


# the per-row helpers are inlined into their loops (numba IR, no call per row), as in
# ``_fused.py``: gates + output + both backwards on 400 rows of H=64, fp32, 161 -> 86 us (CPU
# time, bit-identical; fp64 810 -> 740 us).
@_jit_inline
def _gates_row(r, z, h, rh):  # type: ignore[no-untyped-def]
    for j in range(h.shape[0]):
        x = _sigmoid(r[j])
        r[j] = x
        rh[j] = x * h[j]
    for j in range(z.shape[0]):
        z[j] = _sigmoid(z[j])


@_jit
def _gates(p, h, rh):  # type: ignore[no-untyped-def]
    n = h.shape[1]
    for b in range(p.shape[0]):
        row = p[b]
        _gates_row(row[:n], row[n:2 * n], h[b], rh[b])

def gru_gates(p: Tensor, h: Tensor, rh: Tensor) -> None:
    """In place ``P[:, :2H] = sigmoid(.)`` (``r z``), and ``rh = r * h``."""
    _gates(p.numpy(), h.numpy(), rh.numpy())


@_jit_inline
def _output_row(z, c, h, out):  # type: ignore[no-untyped-def]
    for j in range(h.shape[0]):
        x = _tanh(c[j])
        c[j] = x
        out[j] = x + z[j] * (h[j] - x)


@_jit
def _output(p, h, out):  # type: ignore[no-untyped-def]
    n = h.shape[1]
    for b in range(p.shape[0]):
        row = p[b]
        _output_row(row[n:2 * n], row[2 * n:3 * n], h[b], out[b])

def gru_output(p: Tensor, h: Tensor, out: Tensor) -> None:
    """In place ``P[:, 2H:] = c = tanh(.)``; ``out = z h + (1 - z) c``."""
    _output(p.numpy(), h.numpy(), out.numpy())


@_jit
def _back_c(g, p, h, d, dh):  # type: ignore[no-untyped-def]
    # 2-D indexing, no row-slice views (a row helper over slices of ``p`` and ``d``: 34 ->
    # 26 us on 854 rows of H=64, fp32, warm; bit-identical)
    n = h.shape[1]
    for b in range(p.shape[0]):
        for j in range(n):
            zj, cj, gj = p[b, n + j], p[b, 2 * n + j], g[b, j]
            d[b, 2 * n + j] = gj * (1 - zj) * (1 - cj * cj)
            d[b, n + j] = gj * (h[b, j] - cj) * zj * (1 - zj)
            dh[b, j] = gj * zj

def gru_backward_c(grad: Tensor, p: Tensor, h: Tensor, d: Tensor, dh: Tensor) -> None:
    """From ``grad = d h'`` and the forward's ``P = [r z c]``: ``D[:, H:3H]`` = the
    pre-activation gradients of ``z`` and ``c``, and ``dh = grad * z``."""
    _back_c(grad.numpy(), p.numpy(), h.numpy(), d.numpy(), dh.numpy())


@_jit_inline
def _back_r_row(d_rh, r, h, dr, dh):  # type: ignore[no-untyped-def]
    for j in range(h.shape[0]):
        rj, x = r[j], d_rh[j]
        dr[j] = x * h[j] * rj * (1 - rj)
        dh[j] += x * rj


@_jit
def _back_r(d_rh, p, h, d, dh):  # type: ignore[no-untyped-def]
    n = h.shape[1]
    for b in range(p.shape[0]):
        _back_r_row(d_rh[b], p[b, :n], h[b], d[b, :n], dh[b])

def gru_backward_r(d_rh: Tensor, p: Tensor, h: Tensor, d: Tensor, dh: Tensor) -> None:
    """From ``d(r h)``: ``D[:, :H]`` = the pre-activation gradient of ``r``; ``dh += d_rh r``."""
    _back_r(d_rh.numpy(), p.numpy(), h.numpy(), d.numpy(), dh.numpy())


@_jit_inline
def _gate_row(s, t, terms):  # type: ignore[no-untyped-def]
    for j in range(terms.shape[0]):
        a, b = _sigmoid(s[j]), _tanh(t[j])
        s[j], t[j] = a, b
        terms[j] = a * b


@_jit
def _gate(g, terms):  # type: ignore[no-untyped-def]
    n = terms.shape[1]
    for b in range(g.shape[0]):
        row = g[b]
        _gate_row(row[:n], row[n:2 * n], terms[b])

def gate_forward(g: Tensor, terms: Tensor) -> None:
    """Readout gate in place: ``G = [sigmoid(.) | tanh(.)]`` (``[N, 2H]``), ``terms = s t``."""
    _gate(g.numpy(), terms.numpy())


@_jit_inline
def _gate_back_row(x, s, t, ds, dt):  # type: ignore[no-untyped-def]
    for j in range(x.shape[0]):
        a, b, xj = s[j], t[j], x[j]
        ds[j] = xj * b * a * (1 - a)
        dt[j] = xj * a * (1 - b * b)


@_jit
def _gate_back(grad, segment, g, d):  # type: ignore[no-untyped-def]
    n = grad.shape[1]
    for b in range(g.shape[0]):
        row, drow = g[b], d[b]
        _gate_back_row(grad[segment[b]], row[:n], row[n:2 * n], drow[:n], drow[n:2 * n])

def gate_backward(grad: Tensor, segment: Tensor, g: Tensor, d: Tensor) -> None:
    """Readout gate backward: ``D`` (``[N, 2H]``) = the pre-activation gradients, row ``n``
    from ``grad[segment[n]]`` and the forward's ``G``."""
    _gate_back(grad.numpy(), segment.numpy(), g.numpy(), d.numpy())


# ---------------------------------------------------------------------- repeated operands
@_jit
def _slots(counts):  # type: ignore[no-untyped-def]
    top = 0
    for v in range(counts.shape[0]):
        top = max(top, counts[v])
    return top


@_jit
def _rows(counts, codes, slots, bonds, node, index, deg):  # type: ignore[no-untyped-def]
    r = 0  # (slots: from the counts, so one merged operand of every repeated row serves too)
    for k in range(_slots(counts)):
        for v in range(counts.shape[0]):
            if counts[v] > k and r < node.shape[0]:
                node[r] = v
                if bonds:
                    b = v * bonds + ((codes[v] >> (2 * k)) & 3)
                    index[r] = b
                    deg[b] += 1
                r += 1
    return r


def repeated_nodes(counts: Tensor, rows: int, slots: int) -> Tensor:
    """``int64[rows]``: the node of every repeated operand row, slot after slot, each slot's
    nodes ascending (``cat(slot_nodes(counts, sizes))``), in one compiled loop (CPU;
    ``ValueError`` unless the counts add up to ``rows``, :func:`check_counts`)."""
    node = torch.empty(rows, dtype=torch.int64)
    view, c = node.numpy(), counts.numpy()
    check_counts(c, rows)
    _rows(c, view, slots, 0, view, view, view)
    return node


def bond_buckets(attrs: Tensor, rows: int, slots: int, bonds: int, count_bits: int,
                 dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(index int64[rows], deg [B * bonds])`` of ``ggnn.update`` attrs (CPU): each repeated
    row's ``node * bonds + bond type`` bucket and each bucket's row count, in one compiled
    loop (the attr's low ``count_bits`` bits count the rows, then 2 bits per bond type)."""
    index = torch.empty(rows, dtype=torch.int64)
    deg = torch.zeros(attrs.shape[0] * bonds, dtype=dtype)
    a = attrs.numpy()
    check_counts(a, rows, count_bits)
    _rows(a & ((1 << count_bits) - 1), a >> count_bits, slots, bonds, index.numpy(),
          index.numpy(), deg.numpy())
    return index, deg


@_jit
def _compact(counts, codes, slots, bonds, deg, pos, nodes, offsets, bucket):  # type: ignore[no-untyped-def]
    size = counts.shape[0]
    r = _rows(counts, codes, slots, bonds, bucket, bucket, deg)  # node * bonds + bond per row
    c = 0
    for t in range(bonds):  # the non-empty buckets, bond type after bond type
        offsets[t] = c
        for v in range(size):
            if deg[v * bonds + t] > 0:
                pos[v * bonds + t] = c
                nodes[c] = v
                c += 1
    offsets[bonds] = c
    for i in range(r):
        bucket[i] = pos[bucket[i]]


def compact_buckets(attrs: Tensor, rows: int, slots: int, bonds: int, count_bits: int,
                    dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, list[int]]:
    """``(bucket int64[rows], deg [B * bonds], nodes int64[M], offsets)`` of
    ``ggnn.update`` attrs (CPU), for the compact message form: the ``M`` non-empty
    ``(node, bond type)`` buckets numbered bond type after bond type (those of type ``t``
    are ``offsets[t]:offsets[t + 1]``, nodes ascending), ``nodes`` the node of each,
    ``bucket`` the compact bucket of every repeated row (in :func:`repeated_nodes` order)
    and ``deg`` each ``node * bonds + bond`` bucket's row count; one compiled loop."""
    size = attrs.shape[0]
    bucket = torch.empty(rows, dtype=torch.int64)
    deg = torch.zeros(size * bonds, dtype=dtype)
    pos = torch.empty(size * bonds, dtype=torch.int64)
    nodes = torch.empty(size * bonds, dtype=torch.int64)
    offsets = torch.empty(bonds + 1, dtype=torch.int64)
    a = attrs.numpy()
    check_counts(a, rows, count_bits)
    _compact(a & ((1 << count_bits) - 1), a >> count_bits, slots, bonds, deg.numpy(),
             pos.numpy(), nodes.numpy(), offsets.numpy(), bucket.numpy())
    bounds = offsets.tolist()
    return bucket, deg, nodes[:bounds[-1]], bounds


@_jit
def _add_rows(rows, bucket, start, s):  # type: ignore[no-untyped-def]
    for i in range(rows.shape[0]):
        src, dst = rows[i], s[bucket[start + i]]
        for j in range(src.shape[0]):
            dst[j] += src[j]


def bucket_sums(slots: list[Tensor], bucket: Tensor, count: int) -> Tensor:
    """``[count, H]``: the rows of ``slots`` (in order) summed into their ``bucket``s
    (CPU), one compiled loop per slot (no ``cat``)."""
    s = slots[0].new_zeros(count, slots[0].shape[1])
    view, index, start = s.numpy(), bucket.numpy(), 0
    for rows in slots:
        _add_rows(rows.numpy(), index, start, view)
        start += rows.shape[0]
    return s


@_jit
def _add_indexed(src, src_rows, dst, dst_rows, width):  # type: ignore[no-untyped-def]
    """``dst[dst_rows[i], :width] += src[src_rows[i], :width]`` for every ``i``, in order."""
    for i in range(src_rows.shape[0]):
        a, b = src[src_rows[i]], dst[dst_rows[i]]
        for j in range(width):
            b[j] += a[j]


def bucket_sums_at(arena: Tensor, idx: Tensor, bucket: Tensor, count: int) -> Tensor:
    """``[count, H]``: arena rows ``idx`` summed into their ``bucket``s (CPU), read in
    place (no gathered copy of the rows)."""
    s = arena.new_zeros(count, arena.shape[1])
    _add_indexed(arena.numpy(), idx.numpy(), s.numpy(), bucket.numpy(), s.shape[1])
    return s


@_jit
def _scatter_messages(m, nodes, deg, c, a):  # type: ignore[no-untyped-def]
    bonds, width = c.shape[0], a.shape[1]
    for v in range(a.shape[0]):
        for j in range(width):
            a[v, j] = deg[v * bonds] * c[0, j]
        for b in range(1, bonds):
            k = deg[v * bonds + b]
            for j in range(width):
                a[v, j] += k * c[b, j]
    for i in range(m.shape[0]):
        v = nodes[i]
        for j in range(width):
            a[v, j] += m[i, j]


def scatter_messages(m: Tensor, nodes: Tensor, deg: Tensor, c: Tensor, out: Tensor) -> Tensor:
    """``out = deg C + sum of the bucket messages m[i] into their nodes[i]`` (``deg``
    ``[B * bonds]``, ``C`` ``[bonds, H]``; the torch form's ``mm(deg, C).index_add_(0,
    nodes, m)`` in one loop, no ``[B, H]`` GEMM output and second pass); returns ``out``."""
    _scatter_messages(m.numpy(), nodes.numpy(), deg.numpy(), c.numpy(), out.numpy())
    return out


class BucketGrad:
    """The gradient of rows read in place and summed into buckets (:func:`bucket_sums_at`):
    row ``i`` gets bucket ``bucket[i]``'s gradient ``d_s``. An ``IndexedRead`` routes it
    with :meth:`add_to`, straight into the gradient arena (no ``[rows, H]`` copy)."""

    __slots__ = ("bucket", "d_s")

    def __init__(self, d_s: Tensor, bucket: Tensor) -> None:
        self.d_s, self.bucket = d_s, bucket

    def add_to(self, buf: Tensor, idx: Tensor) -> None:
        """``buf[idx[i], :H] += d_s[bucket[i]]`` for every read row ``i`` (one loop)."""
        _add_indexed(self.d_s.numpy(), self.bucket.numpy(), buf.numpy(), idx.numpy(),
                     self.d_s.shape[1])


# ---------------------------------------------------------------------- atom embedding
@_jit
def _embed_sum(codes, offset, radix, size, table, out):  # type: ignore[no-untyped-def]
    limit = radix[radix.shape[0] - 1] * size[size.shape[0] - 1]  # (codes: 0..limit - 1)
    for b in range(codes.shape[0]):
        code, row = codes[b], out[b]
        if code < 0 or code >= limit:
            return b
        src = table[offset[0] + (code // radix[0]) % size[0]]
        for j in range(row.shape[0]):
            row[j] = src[j]
        for f in range(1, offset.shape[0]):
            src = table[offset[f] + (code // radix[f]) % size[f]]
            for j in range(row.shape[0]):
                row[j] += src[j]
    return -1


def embed_forward(codes: Tensor, mixed: tuple[Tensor, Tensor, Tensor], table: Tensor,
                  out: Tensor) -> None:
    """``out[b] = sum_f table[offset_f + (codes[b] // radix_f) % size_f]`` (features in
    order, ``mixed = (offset, radix, size)``, ``int64[F]``): the packed atoms' rows summed in
    one loop, no ``[F, B, H]`` block; ``ValueError`` on a code outside the packing
    (:func:`check_codes`)."""
    offset, radix, size = (t.numpy() for t in mixed)
    b = _embed_sum(codes.numpy(), offset, radix, size, table.numpy(), out.numpy())
    if b >= 0:
        check_codes(codes, mixed)


@_jit
def _embed_grad(codes, offset, radix, size, grad, d_table, touched):  # type: ignore[no-untyped-def]
    for b in range(codes.shape[0]):
        code, g = codes[b], grad[b]
        for f in range(offset.shape[0]):
            r = offset[f] + (code // radix[f]) % size[f]
            touched[r] = 1
            dst = d_table[r]
            for j in range(g.shape[0]):
                dst[j] += g[j]


def embed_backward(codes: Tensor, mixed: tuple[Tensor, Tensor, Tensor], grad: Tensor,
                   rows: int) -> tuple[Tensor, Tensor]:
    """``(index int64[R], d_rows [R, H])``: the gradient of the rows of a ``rows``-row table
    that :func:`embed_forward` read (ascending, each once), every read's ``grad`` row summed
    into its table row in one loop (``R <= rows``, not ``F * B`` rows)."""
    offset, radix, size = (t.numpy() for t in mixed)
    d_table = grad.new_zeros(rows, grad.shape[1])
    touched = torch.zeros(rows, dtype=torch.int8)
    _embed_grad(codes.numpy(), offset, radix, size, grad.numpy(), d_table.numpy(),
                touched.numpy())
    index = torch.nonzero(touched).view(-1)
    return index, d_table.index_select(0, index)
