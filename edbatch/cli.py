"""Command-line helpers for scripts built on edbatch (the examples, benchmarks and training
CLIs use them): ``argparse`` types that refuse a bad count or a folder to write in one usage
line, and a ``main`` wrapper that ends an edbatch error (a corrupt policy file, a bad option
found while running) in one ``error:`` line and exit status 2 instead of a traceback.

    p.add_argument("--batch-size", type=positive, default=32)
    ...
    if __name__ == "__main__":
        run(main)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edbatch.errors import EdbatchError

__all__ = ["out_file", "positive", "run"]


def positive(text: str) -> int:
    """An int >= 1 (a count: sentences, epochs, a batch size): ``0``, ``-5`` or ``abc`` is
    one usage line naming the value (``range()`` or a tensor shape raised deep in a run)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: expected an int >= 1, "
                                         f"e.g. 5")
    return value


def out_file(text: str) -> Path:
    """A file to write at the end of a run: refused up front if it is a folder (the run's
    results would be lost when the write fails)."""
    path = Path(text)
    if not text or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file to write; pass a "
                                         f"file path, e.g. {Path(text) / 'results.json'}")
    return path


def run(main: Callable[..., Any], *args: Any) -> Any:
    """Call a script's ``main``; an edbatch error ends in one ``error:`` line and exit status
    2, not a traceback (``EDBATCH_FULL_ERROR=1`` re-raises for developers)."""
    try:
        return main(*args)
    except EdbatchError as e:
        if os.environ.get("EDBATCH_FULL_ERROR") == "1":
            raise
        print(f"error: {e}", file=sys.stderr)
        print("(set EDBATCH_FULL_ERROR=1 for the full traceback)", file=sys.stderr)
        raise SystemExit(2) from None
