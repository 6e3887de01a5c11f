"""The header check every learned-weights artifact shares: format, version, feature list."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edbatch.errors import PolicyFileError

__all__ = ["check_header"]


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
