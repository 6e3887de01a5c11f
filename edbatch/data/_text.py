"""Private helpers shared by the data parsers: strict UTF-8 reading and line splitting."""

from __future__ import annotations

import functools
import gc
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edbatch.errors import DataFormatError

__all__ = ["file_key", "gc_paused", "parsed", "read_json", "read_lines", "read_text", "shorten"]


def read_text(path: str | Path) -> str:
    r"""Read a whole file as UTF-8 text.

    Args:
        path: File to read.

    Returns:
        The decoded text (``\r\n`` line ends are left as they are; a leading UTF-8
        byte-order mark is dropped).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        DataFormatError: If the bytes are not valid UTF-8 (names the line of the first bad byte).
    """
    raw = Path(path).read_bytes()
    if raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark (Windows editors): not text
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        bad = raw[exc.start : exc.end]
        raise DataFormatError(
            path,
            line,
            f"bytes {bad!r} at column {column} that are not UTF-8",
            "UTF-8 encoded text",
            "re-encode the file as UTF-8 (e.g. with iconv)",
        ) from None


def read_json(path: str | Path, expected: str) -> Any:
    """Read a whole UTF-8 file as one JSON document.

    Args:
        path: File to read.
        expected: What the file should hold, for the error message (e.g. "CLEVR's
            metadata.json").

    Raises:
        DataFormatError: If the bytes are not UTF-8 or not valid JSON (names the line).
    """
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        found = "an empty file" if not text.strip() else \
            f"invalid JSON ({exc.msg}; column {exc.colno})"
        raise DataFormatError(path, exc.lineno if text.strip() else 1, found, expected,
                              "check the path; restore the file if it was cut or edited"
                              ) from None


def read_lines(path: str | Path) -> list[str]:
    r"""Read a UTF-8 file and split it into lines, numbered like editors and ``wc -l`` do.

    Only ``\n`` separates lines (a trailing ``\r`` is dropped), so line numbers in error
    messages match what an editor shows even if a sentence contains exotic Unicode breaks.

    Args:
        path: File to read.

    Returns:
        The lines without their terminators; ``lines[i]`` is line ``i + 1``. A final newline
        does not produce an extra empty line.
    """
    text = read_text(path)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if "\r" in text:
        lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
    return lines


def shorten(text: str, limit: int = 60) -> str:
    """Return ``repr(text)``, cut to about ``limit`` characters for use in error messages."""
    if len(text) > limit:
        return repr(text[:limit]) + "..."
    return repr(text)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while many small objects are created.

    Collections triggered by allocation dominate the time of parsing or flattening
    thousands of trees; nothing created there forms cycles.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def file_key(path: str | Path) -> tuple[str, int, int]:
    """A file's cache key: its resolved path, modification time and size, so a file edited
    since it was parsed is parsed again."""
    p = Path(path).resolve()
    st = p.stat()
    return str(p), st.st_mtime_ns, st.st_size


def parsed(parse: Callable[..., Any], path: str | Path, **options: Any) -> Any:
    """``parse(path, **options)``, cached per process by the parser, :func:`file_key` and
    options (a large treebank is read once however many workloads and splits use it; an
    edited file is read again). Errors are not cached: a bad file raises every time."""
    return _parsed(parse, file_key(path), tuple(sorted(options.items())))


@functools.lru_cache(maxsize=8)
def _parsed(parse: Callable[..., Any], key: tuple[str, int, int],
            options: tuple[tuple[str, Any], ...]) -> Any:
    return parse(key[0], **dict(options))
