"""edbatch/_numba_cache.py: numba caches are deleted when any compiled source changes."""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import edbatch
from edbatch._numba_cache import COMPILED_MODULES, STAMP, cache_dirs, refresh

PKG = Path(edbatch.__file__).resolve().parent


def test_the_list_names_every_module_with_cached_numba_functions() -> None:
    """Every module whose functions numba caches, found two ways: ``@njit(cache=True)`` in
    its text, and the cached dispatchers of the imported package (which also sees a shared
    decorator, e.g. ``_jit = njit(..., cache=True)`` used from another module: its cache
    files are named after the module that uses it)."""
    decorated = re.compile(r"^\s*@(numba\.)?njit\([^)]*cache\s*=\s*True", re.MULTILINE)
    cached = {str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
              if decorated.search(p.read_text())}
    from numba.core.caching import NullCache
    from numba.core.dispatcher import Dispatcher
    for info in pkgutil.walk_packages(edbatch.__path__, "edbatch."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, Dispatcher) and not isinstance(value._cache, NullCache):
                cached.add(value.py_func.__module__.removeprefix("edbatch.").replace(".", "/")
                           + ".py")
    assert cached == set(COMPILED_MODULES)


def _tree(tmp: Path) -> Path:
    (tmp / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp / "pkg" / "a.py").write_text("x = 1\n")
    (tmp / "pkg" / "b.py").write_text("y = 1\n")
    for name in ("a.f-3.py311.nbi", "a.f-3.py311.1.nbc", "b.g-1.py311.nbi", "other.h-1.py311.nbi"):
        (tmp / "pkg" / "__pycache__" / name).write_bytes(b"cache")
    return tmp


def test_caches_go_when_any_source_changes_and_stay_otherwise(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    mods = ("pkg/a.py", "pkg/b.py")
    cache = root / "pkg" / "__pycache__"
    first = refresh(root, mods, env={})  # no stamp yet: the caches' sources are unknown
    assert sorted(p.name for p in first) == ["a.f-3.py311.1.nbc", "a.f-3.py311.nbi",
                                             "b.g-1.py311.nbi"]
    assert (cache / "other.h-1.py311.nbi").exists()  # not one of the listed modules
    assert (cache / STAMP).is_file()
    (cache / "a.f-3.py311.nbi").write_bytes(b"fresh")
    assert refresh(root, mods, env={}) == []  # sources unchanged: kept
    assert (cache / "a.f-3.py311.nbi").exists()
    (root / "pkg" / "b.py").write_text("y = 2\n")  # a *callee's* module changes
    assert [p.name for p in refresh(root, mods, env={})] == ["a.f-3.py311.nbi"]


def test_numba_cache_dir_is_covered(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    user = tmp_path / "numba_cache"
    env = {"NUMBA_CACHE_DIR": str(user)}
    d = cache_dirs(root / "pkg" / "a.py", env)[1]
    d.mkdir(parents=True)
    (d / "a.f-3.py311.nbi").write_bytes(b"cache")
    assert d.parent == user and d.name.startswith("pkg_")
    assert d / "a.f-3.py311.nbi" in refresh(root, ("pkg/a.py",), env=env)


def test_an_unwritable_or_missing_folder_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    assert refresh(tmp_path, ("pkg/a.py", "pkg/gone.py"), env={}) == []


CALLEE = "from numba import njit\n\n@njit(cache=True)\ndef f():\n    return {}\n"
CALLER = ("from numba import njit\nfrom callee import f\n\n@njit(cache=True)\n"
          "def g():\n    return f() + 0\n")
RUN = textwrap.dedent("""
    import sys
    sys.path.insert(0, {src!r})
    if {fresh}:
        from edbatch._numba_cache import refresh
        from pathlib import Path
        refresh(Path({src!r}).parent, ("src/callee.py", "src/caller.py"), env={{}})
    from caller import g
    print(g())
""")


def _g(src: Path, fresh: bool) -> str:
    out = subprocess.run([sys.executable, "-c", RUN.format(src=str(src), fresh=fresh)],
                         capture_output=True, text=True, timeout=300,
                         env={"PATH": "", "PYTHONDONTWRITEBYTECODE": "1"},  # no stale .pyc
                         check=True)
    return out.stdout.strip()


def test_real_numba_runs_a_changed_callee_only_after_refresh(tmp_path: Path) -> None:
    """numba alone keeps the caller's cached code when only the callee's module changes
    (the bug); with refresh the caller recompiles against the new callee."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "callee.py").write_text(CALLEE.format(1))
    (src / "caller.py").write_text(CALLER)
    assert _g(src, fresh=False) == "1"
    (src / "callee.py").write_text(CALLEE.format(2))
    assert _g(src, fresh=False) == "1"  # stale: what refresh exists for
    assert _g(src, fresh=True) == "2"
