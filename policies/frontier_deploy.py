"""The frontier network deployed: numpy / numba inference per decision, and its weight file.

The network (:mod:`policies.frontier_net` trains it) scores every ready op type from that
type's feature row (:mod:`policies._frontier_features`) and a context pooled over all ready
types::

    h_a   = relu(relu(x_a W1 + b1) W2 + b2)             (shared per-type MLP)
    ctx   = [mean_a h_a, max_a h_a]                      (permutation invariant)
    s_a   = relu([h_a, ctx] V1 + c1) . v2 + c2           (shared scorer)

and batches the type with the highest score (masked types are never scored: only ready
batchable types have rows). The same weights serve any number of op types and any workload.
:class:`FrontierNetPolicy` is an :class:`edbatch.schedule.Policy` (so
:class:`~edbatch.schedule.PolicyScheduler` runs it); its ``backend`` is ``numba`` (the
scorer compiled, the default) or ``numpy``. The weight file is an ``.npz`` of the arrays plus
a JSON header (format, version, feature names, training metadata).
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit
from numpy.typing import NDArray

from edbatch.errors import PolicyFileError, UnknownNameError
from edbatch.schedule import FrontierView, PolicyScheduler, Scheduler
from policies._frontier_features import FEATURES, NUM_FEATURES, FeatureTracker
from policies._header import check_header, metadata_of, save_path

__all__ = ["BACKENDS", "FORMAT", "WEIGHT_NAMES", "FrontierNetPolicy", "load_weights",
           "numpy_scores", "save_weights"]

FORMAT = "edbatch.frontier_net"
VERSION = 1
#: The arrays of a weight file, in the order the scorer takes them.
WEIGHT_NAMES = ("W1", "b1", "W2", "b2", "V1", "c1", "v2", "c2")
BACKENDS = ("numba", "numpy")
Weights = dict[str, NDArray[np.float64]]


def numpy_scores(x: NDArray[np.floating], w: Mapping[str, NDArray[np.float64]]
                 ) -> NDArray[np.float64]:
    """Scores of the rows of ``x`` (``[R, NUM_FEATURES]``), plain numpy."""
    h = np.maximum(np.maximum(x @ w["W1"] + w["b1"], 0.0) @ w["W2"] + w["b2"], 0.0)
    hid = h.shape[1]
    ctx = h.mean(0) @ w["V1"][hid:2 * hid] + h.max(0) @ w["V1"][2 * hid:]
    z = np.maximum(h @ w["V1"][:hid] + ctx + w["c1"], 0.0)
    return z @ w["v2"] + w["c2"][0]  # type: ignore[no-any-return]


@njit(cache=True, nogil=True)
def _dense_relu(x, w, b, out):  # type: ignore[no-untyped-def]
    """``out[:] = relu(x @ w + b)`` for one row ``x``, compiled."""
    for j in range(len(b)):
        s = b[j]
        for m in range(len(x)):
            s += x[m] * w[m, j]
        out[j] = s if s > 0.0 else 0.0


@njit(cache=True, nogil=True)
def _best_row(x, w1, b1, w2, b2, v1, c1, v2, c2):  # type: ignore[no-untyped-def]
    """Index of the highest-scoring row (the first on ties), compiled."""
    r = x.shape[0]
    hid = w1.shape[1]
    h1 = np.empty(hid)
    h = np.empty((r, hid))
    for i in range(r):
        _dense_relu(x[i], w1, b1, h1)
        _dense_relu(h1, w2, b2, h[i])
    pooled = np.empty(2 * hid)  # [mean, max] over the rows (h >= 0)
    pooled[:] = 0.0
    for i in range(r):
        for j in range(hid):
            pooled[j] += h[i, j] / r
            pooled[hid + j] = max(pooled[hid + j], h[i, j])
    ctx = c1.copy()
    for m in range(2 * hid):
        for j in range(len(c1)):
            ctx[j] += pooled[m] * v1[hid + m, j]
    z = np.empty(len(c1))
    best, best_s = 0, -np.inf
    for i in range(r):
        _dense_relu(h[i], v1[:hid], ctx, z)
        s = c2[0]
        for j in range(len(z)):
            s += z[j] * v2[j]
        if s > best_s:
            best, best_s = i, s
    return best


class FrontierNetPolicy:
    """The frontier network as a batching policy (one decision per :meth:`choose`).

    Args:
        weights: the arrays :data:`WEIGHT_NAMES` (float64), e.g. from :func:`load_weights`.
        backend: ``numba`` (compiled scorer) or ``numpy``.
        metadata: free-form training metadata (saved with the weights).
    """

    needs_typewise = True

    def __init__(self, weights: Mapping[str, NDArray[np.floating]], backend: str = "numba",
                 metadata: Mapping[str, Any] | None = None) -> None:
        if backend not in BACKENDS:
            raise UnknownNameError(f"unknown backend {backend!r}; choose one of "
                                   f"{list(BACKENDS)}")
        _check_shapes(weights, "weights")
        self.weights: Weights = {k: np.ascontiguousarray(weights[k], dtype=np.float64)
                                 for k in WEIGHT_NAMES}
        self._args = tuple(self.weights[k] for k in WEIGHT_NAMES)
        self.backend = backend
        self.metadata = dict(metadata or {})
        self._tracker = FeatureTracker()

    def choose(self, view: FrontierView) -> int:
        """The ready op type with the highest score."""
        ready, x = self._tracker.features(view)
        if len(ready) == 1:
            a = ready[0]
        elif self.backend == "numba":
            a = ready[_best_row(x.astype(np.float64), *self._args)]
        else:
            a = ready[int(np.argmax(numpy_scores(x.astype(np.float64), self.weights)))]
        self._tracker.record(a)
        return a

    def scores(self, view: FrontierView) -> tuple[list[int], NDArray[np.float64]]:
        """(ready op ids, their scores) without deciding (no history is recorded)."""
        ready, x = self._tracker.features(view)
        return ready, numpy_scores(x.astype(np.float64), self.weights)

    def fork(self) -> FrontierNetPolicy:
        """A fresh policy with the same weights (its own decision history)."""
        return FrontierNetPolicy(self.weights, self.backend, self.metadata)

    def scheduler(self, name: str = "frontier_net") -> Scheduler:
        """A scheduler that asks this network at every decision."""
        return PolicyScheduler(self.fork(), name)

    def save(self, path: str | Path) -> Path:
        """Write the weights (see :func:`save_weights`)."""
        return save_weights(path, self.weights, self.metadata)

    @classmethod
    def load(cls, path: str | Path, backend: str = "numba") -> FrontierNetPolicy:
        """Read a weight file written by :meth:`save` (see :func:`load_weights`)."""
        weights, meta = load_weights(path)
        return cls(weights, backend, meta)


def _check_shapes(w: Mapping[str, Any], where: str) -> None:
    """Raise ``ValueError`` naming the first missing or misshapen array."""
    missing = [k for k in WEIGHT_NAMES if k not in w]
    if missing:
        raise ValueError(f"{where} lack the arrays {missing} (need {list(WEIGHT_NAMES)})")
    hid, out = np.shape(w["W1"])[1:2] or (0,), np.shape(w["c1"])
    want = {"W1": (NUM_FEATURES, hid[0]), "b1": (hid[0],), "W2": (hid[0], hid[0]),
            "b2": (hid[0],), "V1": (3 * hid[0], out[0] if out else 0), "c1": out,
            "v2": out, "c2": (1,)}
    for k in WEIGHT_NAMES:
        if tuple(np.shape(w[k])) != tuple(want[k]):
            raise ValueError(f"{where}: array {k} has shape {tuple(np.shape(w[k]))}, expected "
                             f"{tuple(want[k])} for {NUM_FEATURES} features")


def save_weights(path: str | Path, weights: Mapping[str, NDArray[np.floating]],
                 metadata: Mapping[str, Any] | None = None) -> Path:
    """Write ``weights`` and a JSON header to ``path`` (``.npz``, atomically)."""
    path = save_path(path)
    header = {"format": FORMAT, "version": VERSION, "features": list(FEATURES),
              "metadata": dict(metadata or {})}
    arrays = {k: np.asarray(weights[k], dtype=np.float64) for k in WEIGHT_NAMES}
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, header=np.array(json.dumps(header, default=str)), **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_weights(path: str | Path) -> tuple[Weights, dict[str, Any]]:
    """``(weights, metadata)`` from a file written by :func:`save_weights`.

    Raises:
        PolicyFileError: the file is missing, not such a weight file (corrupt), of another
            format version, or made for other features / shapes.
    """
    path = Path(path)
    fix = "retrain with python -m experiments.frontier_net (it saves the weights) or pass " \
          "the right file"
    if not path.is_file():
        raise PolicyFileError(path, "no such weight file", fix)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: np.array(data[k]) for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise PolicyFileError(path, f"not a frontier-network weight file ({e})", fix) from None
    try:
        header = json.loads(str(arrays.pop("header")))
    except (KeyError, ValueError) as e:
        raise PolicyFileError(path, f"no readable header ({e})", fix) from None
    check_header(path, header, FORMAT, VERSION, FEATURES, fix)
    try:
        _check_shapes(arrays, "the weights")
        metadata = metadata_of(header)
    except (TypeError, ValueError) as e:
        raise PolicyFileError(path, str(e), fix) from None
    return {k: arrays[k] for k in WEIGHT_NAMES}, metadata
