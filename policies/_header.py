"""The header check every learned-weights artifact shares: format, version, feature list."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edbatch.errors import PolicyFileError

__all__ = ["artifact_format", "check_header"]


def check_header(path: Path, header: Any, fmt: str, version: int,
                 features: Sequence[str], fix: str) -> None:
    """Raise :class:`PolicyFileError` naming the field unless ``header`` (the artifact's
    parsed header) has format ``fmt``, version ``version`` and exactly ``features``."""
    found = header.get("format") if isinstance(header, dict) else header
    if found != fmt:
        raise PolicyFileError(path, f"format {found!r} is not {fmt!r}", fix)
    if header.get("version") != version:
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
