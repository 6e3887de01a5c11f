"""Typed computation-graph dumps exported by ED-Batch (``data/graphs/<workload>_B<b>/G<k>.txt``).

Format: line 1 is the node count ``N``; then ``N`` lines ``type n_args arg_1 ... arg_n`` in
topological order, each arg the index of an earlier node. ``type`` is DyNet's auto-batching
signature id (0 = unbatchable). Lines may carry trailing spaces (``"0 0 "``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np

from edbatch.data._text import read_lines, shorten
from edbatch.errors import DataFormatError

__all__ = ["GraphDump", "load_dump", "load_dump_folder", "save_dump"]

_INT = re.compile(r"-?[0-9]+")
_DUMP_NAME = re.compile(r"G([0-9]+)\.txt")


@dataclass(frozen=True, slots=True, eq=False)
class GraphDump:
    """One typed DAG in CSR form. Arrays are read-only ``int64``; equality is identity.

    Attributes:
        types: Signature id of each node, shape ``[N]`` (0 = unbatchable).
        arg_ptr: Node ``i``'s args are ``args[arg_ptr[i]:arg_ptr[i + 1]]``, shape ``[N + 1]``.
        args: Concatenated argument node indices, shape ``[E]``; each is < its node's index.
        path: The file the dump was read from.
    """

    types: np.ndarray
    arg_ptr: np.ndarray
    args: np.ndarray
    path: str

    @property
    def num_nodes(self) -> int:
        """Number of nodes ``N``."""
        return int(self.types.shape[0])

    @property
    def num_edges(self) -> int:
        """Number of argument edges ``E``."""
        return int(self.args.shape[0])

    def node_args(self, node: int) -> np.ndarray:
        """Return the argument node indices of ``node`` (in operand order)."""
        return self.args[self.arg_ptr[node] : self.arg_ptr[node + 1]]

    def arity(self) -> np.ndarray:
        """Return the number of args of every node, shape ``[N]``."""
        return np.diff(self.arg_ptr)


def _fail(path: str, line: int, found: str, expected: str, fix: str = "") -> NoReturn:
    """Raise a :class:`DataFormatError` (a helper that type checkers know never returns)."""
    raise DataFormatError(path, line, found, expected, fix)


def _ints(fields: list[str], path: str, line: int) -> list[int]:
    """Convert the fields of one node line to ints, naming the first non-integer field."""
    for column, field in enumerate(fields, start=1):
        if _INT.fullmatch(field) is None:
            _fail(path, line, f"the non-integer field {shorten(field)} (field {column})",
                  "integers 'type n_args arg_1 ... arg_n'", "fix the node line")
    return [int(field) for field in fields]


def _node(fields: list[str], node: int, path: str, line: int) -> tuple[int, list[int]]:
    """Parse and check the line of ``node``; return its type and args."""
    if len(fields) < 2:
        _fail(path, line, f"{len(fields)} field(s) for node {node}",
              "at least 'type n_args'", "fix the node line")
    values = _ints(fields, path, line)
    node_type, n_args, args = values[0], values[1], values[2:]
    if node_type < 0:
        _fail(path, line, f"type {node_type} for node {node}", "a type id >= 0")
    if n_args != len(args):
        _fail(path, line, f"n_args = {n_args} but {len(args)} arg(s) for node {node}",
              "n_args equal to the number of args that follow it", "fix n_args or the args")
    for arg in args:
        if arg < 0:
            _fail(path, line, f"the arg {arg} of node {node}", "a node index >= 0")
        if arg >= node:
            _fail(path, line, f"node {node} refers to node {arg}",
                  f"an arg < {node}: nodes may only refer to earlier nodes (the dump must be "
                  "in topological order)", "reorder the nodes topologically")
    return node_type, args


def load_dump(path: str | Path) -> GraphDump:
    """Load one graph dump.

    Args:
        path: A file such as ``data/graphs/mvrnn_B1/G0.txt``.

    Returns:
        The graph, with ``path`` recorded.

    Raises:
        FileNotFoundError: If the file does not exist.
        DataFormatError: On an empty file, a first line that is not a positive integer, fewer
            or more node lines than declared, non-integer fields, ``n_args`` not matching the
            args, a negative type, or an arg that is not an earlier node.
    """
    name = str(path)
    lines = read_lines(path)
    while lines and not lines[-1].strip():
        lines.pop()  # trailing blank lines are harmless
    if not lines:
        _fail(name, 1, "an empty file", "the node count N on line 1, then N node lines",
              "check the path and the file")
    header = lines[0].strip()
    if _INT.fullmatch(header) is None or int(header) < 1:
        _fail(name, 1, f"the header {shorten(lines[0])}", "a positive node count N",
              "the first line must hold only the number of nodes")
    count = int(header)
    if len(lines) - 1 < count:
        _fail(name, len(lines) + 1, f"{len(lines) - 1} node lines (the file is truncated)",
              f"{count} node lines, as declared on line 1", "restore the missing nodes")
    if len(lines) - 1 > count:
        _fail(name, count + 2, f"{len(lines) - 1} node lines",
              f"{count} node lines, as declared on line 1", "fix the count or remove the rest")
    types: list[int] = []
    arg_ptr: list[int] = [0]
    args: list[int] = []
    for node in range(count):
        node_type, node_args = _node(lines[node + 1].split(), node, name, node + 2)
        types.append(node_type)
        args.extend(node_args)
        arg_ptr.append(len(args))
    return GraphDump(_frozen(types), _frozen(arg_ptr), _frozen(args), name)


def save_dump(path: str | Path, types: np.ndarray, arg_ptr: np.ndarray, args: np.ndarray
              ) -> Path:
    """Write one graph in the dump format, atomically (temp file + rename).

    Args:
        path: the file to write (parent folders are created).
        types: signature id per node (0 = unbatchable).
        arg_ptr: CSR row pointers of the node arguments, length ``N + 1``.
        args: the argument node indices; each must be an earlier node.

    Raises:
        ValueError: inconsistent arrays, a negative type or an argument that is not an
            earlier node (the format needs topological order); nothing is written then.
    """
    types, arg_ptr, args = (np.asarray(a, dtype=np.int64) for a in (types, arg_ptr, args))
    n = len(types)
    if len(arg_ptr) != n + 1 or arg_ptr[0] != 0 or arg_ptr[-1] != len(args) \
            or np.any(np.diff(arg_ptr) < 0):
        raise ValueError(f"arg_ptr (length {len(arg_ptr)}) is not CSR row pointers for {n} "
                         f"nodes and {len(args)} args")
    if n and types.min() < 0:
        raise ValueError(f"type {int(types.min())} is negative; types are signature ids >= 0")
    owner = np.repeat(np.arange(n), np.diff(arg_ptr))
    bad = np.flatnonzero((args < 0) | (args >= owner))
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"node {int(owner[i])} has argument {int(args[i])}, which is not an "
                         f"earlier node; write nodes in topological order")
    lines = [str(n)]
    for v in range(n):
        a = args[arg_ptr[v]:arg_ptr[v + 1]].tolist()
        lines.append(" ".join(map(str, [int(types[v]), len(a), *a])))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def _frozen(values: list[int]) -> np.ndarray:
    """Return ``values`` as a read-only ``int64`` array."""
    array = np.array(values, dtype=np.int64)
    array.setflags(write=False)
    return array


def load_dump_folder(folder: str | Path) -> list[GraphDump]:
    """Load every ``G<k>.txt`` of a folder, sorted by the number ``k``.

    Args:
        folder: A folder such as ``data/graphs/bilstm_B1``. Other files are ignored.

    Returns:
        The dumps, ordered by ``k`` (``G2.txt`` before ``G10.txt``).

    Raises:
        FileNotFoundError: If ``folder`` is not a directory.
        DataFormatError: If it holds no ``G<k>.txt`` (reported as line 0), or a dump is bad.
    """
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory (expected a folder of G<k>.txt dumps)")
    found = []
    for entry in root.iterdir():
        match = _DUMP_NAME.fullmatch(entry.name)
        if match is not None and entry.is_file():
            found.append((int(match.group(1)), entry.name, entry))
    if not found:
        _fail(str(root), 0, "a folder without G<k>.txt files",
              "graph dumps named G0.txt, G1.txt, ...", "check the folder")
    return [load_dump(entry) for _, _, entry in sorted(found)]
