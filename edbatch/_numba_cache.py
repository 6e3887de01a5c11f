"""Keep numba's on-disk caches of the compiled core in step with edbatch's sources.

numba's ``cache=True`` checks a cached function against the hash of its *own* source file
only. A compiled function that calls a compiled helper from another module (the trace and
the rollout call ``_encode`` of ``schedule/_compiled.py``, the keys of
``schedule/_compiled_keys.py``) keeps its cached machine code when only the helper's module
changes, and silently runs the old helper: after a ``git pull`` of an editable install, or
while developing, a new FSM key traced as an old one until the caches were deleted by hand.

:func:`refresh` runs when this module is imported, which :mod:`edbatch` does first: it
hashes the sources of every module in :data:`COMPILED_MODULES` together and compares the
digest with a stamp file kept beside each folder of caches. Where they differ it deletes
that folder's cache files of those modules (``<module>.*.nbi`` / ``*.nbc``) and writes the new
stamp, so the next call recompiles (about a minute for the whole core, once). It costs a
sub-millisecond hash per import and never raises: a folder it cannot write is left as it is.

Cache folders covered: ``__pycache__`` beside each module (numba's default) and, when the
``NUMBA_CACHE_DIR`` environment variable is set, numba's sub-folder for each module there.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["COMPILED_MODULES", "STAMP", "cache_dirs", "refresh", "sources_digest"]

#: every module of the package that defines ``njit(cache=True)`` functions, also through a
#: shared decorator such as ``executor._fused._jit`` (relative to the package folder);
#: ``tests/test_numba_cache.py`` keeps the list complete
COMPILED_MODULES = (
    "api/_assemble.py",
    "api/_bulk_scan.py",
    "api/_read_plan.py",
    "executor/_attr_checks.py",
    "executor/_chain_train.py",
    "executor/_fast_blas.py",
    "executor/_fast_chain.py",
    "executor/_fast_sum.py",
    "executor/_fast_tree.py",
    "executor/_fused.py",
    "executor/_fused_ggnn.py",
    "executor/_fused_sick.py",
    "executor/_ggnn_checks.py",
    "executor/_hoist_ready_compiled.py",
    "executor/cells_module_net_fused.py",
    "executor/cells_module_net_scene.py",
    "executor/cells_module_net_segment_bodies.py",
    "executor/cells_module_net_terminal_fused.py",
    "graph/_csr.py",
    "graph/_scan.py",
    "memory/_aligned_compiled.py",
    "memory/_classify_compiled.py",
    "schedule/_compiled.py",
    "schedule/_compiled_afterstate.py",
    "schedule/_compiled_afterstate_q.py",
    "schedule/_compiled_afterstate_x.py",
    "schedule/_compiled_analysis.py",
    "schedule/_compiled_hash.py",
    "schedule/_compiled_keys.py",
    "schedule/_compiled_priority.py",
    "schedule/_compiled_priority_ctx.py",
    "schedule/_compiled_priority_fsm.py",
    "schedule/_compiled_priority_fused.py",
    "schedule/_compiled_priority_lean.py",
    "schedule/_compiled_priority_steps.py",
    "schedule/_compiled_priority_q.py",
    "schedule/_compiled_release.py",
    "schedule/_compiled_replay.py",
    "schedule/_compiled_scs.py",
    "schedule/_compiled_search.py",
    "schedule/_compiled_rollout.py",
    "schedule/_compiled_sort.py",
    "schedule/_compiled_trace.py",
)
#: name of the stamp file written into each cache folder
STAMP = "edbatch-compiled-sources.sha256"
_ROOT = Path(__file__).resolve().parent


def sources_digest(files: Iterable[Path]) -> str:
    """SHA-256 over the files' names and bytes, in the given order (a missing file counts
    as empty)."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        try:
            h.update(f.read_bytes())
        except OSError:
            h.update(b"<missing>")
    return h.hexdigest()


def cache_dirs(py_file: Path, env: Mapping[str, str] | None = None) -> list[Path]:
    """Where numba may keep the caches of ``py_file``: ``__pycache__`` beside it and, with
    ``NUMBA_CACHE_DIR`` set, numba's sub-folder for its directory there (the name numba's
    ``_CacheLocator.get_suitable_cache_subpath`` gives: parent name + SHA-1 of the path)."""
    env = os.environ if env is None else env
    dirs = [py_file.parent / "__pycache__"]
    user = env.get("NUMBA_CACHE_DIR")
    if user:
        parent = os.path.dirname(os.path.abspath(py_file))
        sub = "_".join([os.path.split(parent)[-1], hashlib.sha1(parent.encode()).hexdigest()])
        dirs.append(Path(user) / sub)
    return dirs


def refresh(root: Path = _ROOT, modules: Iterable[str] = COMPILED_MODULES,
            env: Mapping[str, str] | None = None) -> list[Path]:
    """Delete the compiled modules' numba caches wherever the sources changed since they
    were written (see the module doc). Returns the cache files deleted."""
    files = [root / m for m in modules]
    digest = sources_digest(files)
    by_dir: dict[Path, list[str]] = {}
    for f in files:
        for d in cache_dirs(f, env):
            by_dir.setdefault(d, []).append(f.stem)
    deleted: list[Path] = []
    for d, stems in by_dir.items():
        try:
            if not d.is_dir():
                continue
            stamp = d / STAMP
            if stamp.is_file() and stamp.read_text().strip() == digest:
                continue
            for stem in stems:
                for pattern in (f"{stem}.*.nbi", f"{stem}.*.nbc"):
                    for cached in d.glob(pattern):
                        cached.unlink(missing_ok=True)
                        deleted.append(cached)
            tmp = d / f"{STAMP}.{os.getpid()}"
            tmp.write_text(digest + "\n")
            tmp.replace(stamp)
        except OSError:  # read-only install, a folder removed meanwhile: leave it
            continue
    return deleted


refresh()  # on import, which edbatch/__init__.py does first
