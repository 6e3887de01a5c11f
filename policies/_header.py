"""The header check every learned-weights artifact shares: format, version, feature list."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import PolicyFileError

__all__ = ["artifact_format", "check_header", "metadata_of", "numbers", "op_names", "save_path",
           "strict_int", "write_json"]


def check_header(path: Path, header: Any, fmt: str, version: int,
                 features: Sequence[str], fix: str) -> None:
    """Raise :class:`PolicyFileError` naming the field unless ``header`` (the artifact's
    parsed header) has format ``fmt``, version ``version`` and exactly ``features``."""
    found = header.get("format") if isinstance(header, dict) else header
    if found != fmt:
        raise PolicyFileError(path, f"format {found!r} is not {fmt!r}", fix)
    if type(header.get("version")) is not int or header.get("version") != version:
        raise PolicyFileError(path, f"version {header.get('version')!r}, this edbatch reads "
                              f"{version}", fix)
    if header.get("features") != list(features):
        raise PolicyFileError(path, f"made for the features {header.get('features')}, this "
                              f"edbatch computes {list(features)}", fix)


def artifact_format(path: str | Path) -> str | None:
    """The ``"format"`` field of the JSON artifact at ``path`` (the file read once), or
    ``None`` for anything else (missing, unreadable, not JSON, no such field): the loaders
    dispatch on it and report a bad file themselves."""
    try:
        found = json.loads(Path(path).read_text()).get("format")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def strict_int(value: Any) -> int:
    """A policy file's integer (an op id, a state-key entry); a float (also ``1.0``, NaN), a
    bool or a string raises ``ValueError`` naming it (``int()`` would truncate ``1.5``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not an integer")
    return value


def op_names(value: Any) -> tuple[str, ...]:
    """A policy file's ``op_types``: a list of distinct non-empty names, else ``TypeError`` /
    ``ValueError`` naming the entry (``str()`` would make ``1.5`` or ``NaN`` a name)."""
    if not isinstance(value, list):
        raise TypeError(f"op_types is {value!r}, not a list of names")
    for name in value:
        if not isinstance(name, str) or not name:
            raise TypeError(f"op_types lists {name!r}, not an op type name")
    twice = sorted({n for n in value if value.count(n) > 1})
    if twice:
        raise ValueError(f"op_types lists {twice} more than once")
    return tuple(value)


def metadata_of(header: dict[str, Any]) -> dict[str, Any]:
    """A policy file's free-form ``metadata``: an object (``{}`` when absent or null), else
    ``TypeError`` naming it."""
    found = header.get("metadata")
    if found is None:
        return {}
    if not isinstance(found, dict):
        raise TypeError(f"metadata is {found!r}, not an object")
    return found


def numbers(value: Any) -> NDArray[np.float64]:
    """A policy file's weight list as float64; where an entry is no JSON number (a bool, a
    string such as ``"1.5"``, a list, ...) the whole array is NaN, for the caller's finite
    check to refuse (``np.asarray`` alone reads ``true`` as 1 and ``"1.5"`` as 1.5)."""
    if isinstance(value, np.ndarray) or (hasattr(value, "__array__") and
                                         not isinstance(value, (list, tuple, str, bytes))):
        arr = np.asarray(value)  # (made in Python: a numpy array, a tensor)
        return arr.astype(np.float64) if arr.dtype.kind in "fiu" else np.full(arr.size, np.nan)
    if isinstance(value, (list, tuple)) and all(
            isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
            for v in value):
        return np.asarray(value, dtype=np.float64)
    return np.full(len(value) if isinstance(value, (list, tuple)) else 0, np.nan)


def save_path(path: str | Path) -> Path:
    """Where an artifact is written: ``path``, its folder made; a folder itself is a
    :class:`PolicyFileError` (was a raw ``IsADirectoryError`` at the rename)."""
    path = Path(path)
    if path.is_dir():
        raise PolicyFileError(path, "is a folder, not a policy file to write",
                              f"pass a file path, e.g. {path / 'policy.json'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: str | Path, doc: Any, default: Any = str) -> Path:
    """Write ``doc`` as JSON to :func:`save_path` ``(path)`` atomically: a temporary file in
    the same folder, flushed to disk, then renamed; an interrupted save (Ctrl-C included)
    leaves the old file and no temporary one. ``default``: ``json.dump``'s, for values JSON
    has no form for (``str``; ``None`` refuses them)."""
    path = save_path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, default=default)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
