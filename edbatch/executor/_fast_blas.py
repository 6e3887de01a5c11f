"""torch's BLAS ``?gemm`` called from compiled code (the chains of hoisted LSTM batches).

The chains (:mod:`~edbatch.executor._fast_chain`, :mod:`~edbatch.executor._chain_train`) call
the BLAS ``sgemm_`` / ``dgemm_`` that ``torch.addmm_`` and ``torch.mm`` call on the CPU
(exported by ``libtorch_cpu``), with the same arguments: the same floats. :data:`AVAILABLE`
says whether the symbols are reachable from numba, :func:`agrees` whether the product is
bit for bit ``addmm_``'s (checked once per process).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import torch
from numba import types
from numba.extending import intrinsic, overload

from edbatch.executor._fused import _jit

__all__ = ["AVAILABLE", "agrees"]


def _blas_loaded() -> bool:
    """Make torch's ``sgemm_``/``dgemm_`` resolvable by compiled code; whether they are."""
    try:
        import ctypes

        import llvmlite.binding as llb

        if sys.byteorder != "little":  # (the integer slots below)
            return False
        lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
        handle = ctypes.CDLL(lib)
        if not (hasattr(handle, "sgemm_") and hasattr(handle, "dgemm_")):
            return False
        llb.load_library_permanently(lib)
    except (OSError, RuntimeError, ImportError):
        return False
    return True


#: Whether the BLAS the CPU ``addmm`` calls is reachable from compiled code.
AVAILABLE = _blas_loaded()

# the integer arguments live in int64 slots (little-endian: an LP64 BLAS reads the low half,
# an ILP64 one the whole slot; both see the same value)
_U8, _I32 = types.CPointer(types.uint8), types.CPointer(types.int64)


def _sig(t: types.Type) -> Any:
    p = types.CPointer(t)
    return types.void(_U8, _U8, _I32, _I32, _I32, p, p, _I32, p, _I32, p, p, _I32)


_SGEMM = types.ExternalFunction("sgemm_", _sig(types.float32))
_DGEMM = types.ExternalFunction("dgemm_", _sig(types.float64))


@intrinsic
def _addr(typingctx, arr, off):  # type: ignore[no-untyped-def]  # numba: no annotations
    """The address of ``arr``'s element ``off`` (flat, from its data pointer)."""
    sig = types.CPointer(arr.dtype)(arr, types.intp)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.gep(ary.data, [args[1]])
    return sig, codegen


def _gemm(c, c0, ldc, b, b0, ldb, w, ints, one):  # type: ignore[no-untyped-def]
    """``c[c0:] += b[b0:] @ w`` (row-major, leading dimensions ``ldc``, ``ldb``; ``w``
    contiguous ``[K, N]``): the column-major ``?gemm`` call ``addmm_`` makes."""


@overload(_gemm, inline="always")
def _gemm_impl(c, c0, ldc, b, b0, ldb, w, ints, one):  # type: ignore[no-untyped-def]
    fn = _SGEMM if c.dtype == types.float32 else _DGEMM

    def impl(c, c0, ldc, b, b0, ldb, w, ints, one):  # type: ignore[no-untyped-def]
        # ints: [N, M rows, K, ldw, ldb, ldc, b'N' * 8]
        ints[0], ints[2], ints[3] = w.shape[1], w.shape[0], w.shape[1]
        ints[4], ints[5] = ldb, ldc
        fn(_addr(ints.view(np.uint8), 48), _addr(ints.view(np.uint8), 48), _addr(ints, 0),
           _addr(ints, 1), _addr(ints, 2), _addr(one, 0), _addr(w, 0), _addr(ints, 3),
           _addr(b, b0), _addr(ints, 4), _addr(one, 0), _addr(c, c0), _addr(ints, 5))
    return impl


@_jit
def _gemm_once(c, b, w, ints, one):  # type: ignore[no-untyped-def]
    ints[1] = b.shape[0]
    _gemm(c, 0, c.shape[1], b, 0, b.shape[1], w, ints, one)


_AGREES: list[bool] = []


def agrees() -> bool:
    """Whether the bound ``?gemm`` gives what ``torch.addmm_`` gives, bit for bit, on a
    small float32 and float64 product read with a row stride (checked once per process;
    else no chains are made)."""
    if not _AGREES:
        gen, ok = torch.Generator().manual_seed(0), True
        for dtype in (torch.float32, torch.float64):
            b, w, c = (torch.randn(*shape, generator=gen, dtype=dtype)
                       for shape in ((5, 6), (3, 8), (5, 8)))
            ref, mine = c.clone().addmm_(b.narrow(1, 0, 3), w), c.clone()
            _gemm_once(mine.numpy(), b.numpy(), w.numpy(), _ints(),
                       np.ones(1, mine.numpy().dtype))
            ok = ok and torch.equal(ref, mine)
        _AGREES.append(ok)
    return _AGREES[0]


def _ints() -> np.ndarray:  # type: ignore[type-arg]
    """The ``?gemm`` integer arguments' buffer (int64 slots), ``b'N' * 8`` in its last."""
    ints = np.zeros(7, np.int64)
    ints.view(np.uint8)[48:56] = ord("N")
    return ints
