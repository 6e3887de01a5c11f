"""argparse ``type=`` checks shared by the benchmarks' command lines: a bad value ends in
one usage line naming it (``argument --seed: ...``), not in a numpy or torch traceback
(``positive``, ``out_file`` and ``run`` are :mod:`edbatch.cli`'s, shared with the examples
and the training CLIs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from edbatch.cli import out_file, positive, run
from edbatch.errors import DeviceError
from edbatch.executor.device import check_device

__all__ = ["device", "folder", "out_file", "plot_file", "positive", "run", "seed"]

#: File types matplotlib's ``savefig`` writes (a plot path's suffix).
PLOT_SUFFIXES = ("png", "pdf", "svg", "svgz", "jpg", "jpeg", "eps", "ps", "tif", "tiff",
                 "webp", "gif", "avif", "pgf", "raw", "rgba")


def seed(text: str) -> int:
    """An int numpy's ``RandomState`` takes: in [0, 2**32)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**32 or str(value) != text.strip().lstrip("+"):
        raise argparse.ArgumentTypeError(f"invalid seed {text!r}: expected an int in "
                                         f"[0, 2**32), e.g. 0")
    return value


def plot_file(text: str) -> Path:
    """:func:`out_file` whose suffix is an image type matplotlib writes (``.png``...)."""
    path = out_file(text)
    suffix = path.suffix.lstrip(".").lower()
    if suffix and suffix not in PLOT_SUFFIXES:
        raise argparse.ArgumentTypeError(f"{text!r}: matplotlib cannot write a .{suffix} "
                                         f"plot; use one of .{', .'.join(PLOT_SUFFIXES[:4])} "
                                         f"(e.g. {path.with_suffix('.png')})")
    return path


def folder(text: str) -> str:
    """A folder to read and write in (made when missing): refused if it is a file."""
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder; pass a folder "
                                         f"path (made when missing)")
    return text


def device(text: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` that exists on this machine (returned unchanged)."""
    try:
        check_device(text)
    except DeviceError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text
