"""Tests of edbatch.data.dumps: the real ED-Batch graph dumps and every malformed case."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edbatch.data import GraphDump, load_dump, load_dump_folder
from edbatch.errors import DataFormatError

DATA = Path(__file__).resolve().parents[2] / "data" / "graphs"

# 4 nodes: two sources, a binary node, a unary sink. Node i is on line i + 2.
GOOD_LINES = ["4", "0 0 ", "1 0 ", "2 2 0 1 ", "3 1 2 "]


@pytest.mark.parametrize(
    ("workload", "sizes"),
    [
        ("mvrnn_B1", [16, 32, 16, 28, 28, 24, 144, 148, 156, 76]),
        ("bilstm_B1", [98, 104, 104, 104, 244, 194, 353, 410, 311, 292]),
    ],
)
def test_real_folders(workload: str, sizes: list[int]) -> None:
    dumps = load_dump_folder(DATA / workload)
    assert [d.num_nodes for d in dumps] == sizes
    assert [Path(d.path).name for d in dumps] == [f"G{k}.txt" for k in range(10)]
    arity_of_type: dict[int, set[int]] = {}
    for dump in dumps:
        header = Path(dump.path).read_text(encoding="utf-8").split("\n", 1)[0]
        assert dump.num_nodes == int(header)
        assert dump.arg_ptr.shape == (dump.num_nodes + 1,)
        assert dump.arg_ptr[-1] == dump.num_edges
        for node in range(dump.num_nodes):
            assert np.all(dump.node_args(node) < node)
        for node_type, arity in zip(dump.types.tolist(), dump.arity().tolist(), strict=True):
            arity_of_type.setdefault(node_type, set()).add(arity)
        used = np.zeros(dump.num_nodes, dtype=bool)
        used[dump.args] = True
        assert np.flatnonzero(~used).tolist() == [dump.num_nodes - 1]  # one sink: the last
        assert np.flatnonzero(dump.types == 0).tolist() == [0]
    assert all(len(arities) == 1 for arities in arity_of_type.values())
    assert arity_of_type[0] == {0} and arity_of_type[1] == {0}


def _write(tmp_path: Path, lines: list[str], name: str = "G0.txt") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_small_dump(tmp_path: Path) -> None:
    dump = load_dump(_write(tmp_path, GOOD_LINES))
    assert isinstance(dump, GraphDump)
    assert dump.types.tolist() == [0, 1, 2, 3]
    assert dump.arg_ptr.tolist() == [0, 0, 0, 2, 3]
    assert dump.args.tolist() == [0, 1, 2]
    assert dump.node_args(2).tolist() == [0, 1]
    assert dump.arity().tolist() == [0, 0, 2, 1]
    assert dump.path == str(tmp_path / "G0.txt")
    assert load_dump(_write(tmp_path, [*GOOD_LINES, "", "  "])).num_nodes == 4


def test_folder_sorted_numerically(tmp_path: Path) -> None:
    for k in (10, 2, 1):
        _write(tmp_path, ["1", f"{k} 0"], f"G{k}.txt")
    (tmp_path / "notes.txt").write_text("ignored", encoding="utf-8")
    (tmp_path / "G3.txt.bak").write_text("ignored", encoding="utf-8")
    dumps = load_dump_folder(tmp_path)
    assert [int(d.types[0]) for d in dumps] == [1, 2, 10]


def test_folder_without_dumps(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("x", encoding="utf-8")
    with pytest.raises(DataFormatError, match="without G<k>.txt files"):
        load_dump_folder(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_dump_folder(tmp_path / "missing")


def _error(tmp_path: Path, lines: list[str]) -> DataFormatError:
    path = _write(tmp_path, lines)
    with pytest.raises(DataFormatError) as info:
        load_dump(path)
    assert str(info.value).startswith(f"{path}:{info.value.line}: found ")
    return info.value


def _replace(line_number: int, text: str) -> list[str]:
    lines = list(GOOD_LINES)
    lines[line_number - 1] = text
    return lines


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "G0.txt"
    path.write_text("", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"G0.txt:1: found an empty file"):
        load_dump(path)


@pytest.mark.parametrize("header", ["0", "-4", "four", "4 4", "4.0"])
def test_bad_header(tmp_path: Path, header: str) -> None:
    err = _error(tmp_path, _replace(1, header))
    assert err.line == 1
    assert f"the header '{header}'" in err.found


def test_truncated(tmp_path: Path) -> None:
    err = _error(tmp_path, GOOD_LINES[:4])
    assert err.line == 5
    assert "3 node lines (the file is truncated)" in err.found
    assert "4 node lines, as declared on line 1" in err.expected


def test_more_lines_than_declared(tmp_path: Path) -> None:
    err = _error(tmp_path, [*GOOD_LINES, "1 0 "])
    assert err.line == 6
    assert err.found == "5 node lines"


def test_blank_line_inside(tmp_path: Path) -> None:
    err = _error(tmp_path, [*GOOD_LINES[:3], "", *GOOD_LINES[4:]])
    assert err.line == 4 and "0 field(s) for node 2" in err.found


def test_non_integer_field(tmp_path: Path) -> None:
    err = _error(tmp_path, _replace(4, "2 2 0 x1 "))
    assert err.line == 4
    assert "non-integer field 'x1' (field 4)" in err.found


@pytest.mark.parametrize(("line", "found"), [("2 3 0 1 ", "n_args = 3 but 2 arg(s)"),
                                             ("2 1 0 1 ", "n_args = 1 but 2 arg(s)"),
                                             ("2 -1 ", "n_args = -1 but 0 arg(s)")])
def test_n_args_mismatch(tmp_path: Path, line: str, found: str) -> None:
    err = _error(tmp_path, _replace(4, line))
    assert err.line == 4
    assert f"{found} for node 2" in err.found


def test_negative_type(tmp_path: Path) -> None:
    err = _error(tmp_path, _replace(5, "-3 1 2 "))
    assert err.line == 5 and "type -3 for node 3" in err.found


@pytest.mark.parametrize(("line", "arg"), [("2 2 0 3 ", 3), ("2 2 0 2 ", 2)])
def test_forward_reference_or_cycle(tmp_path: Path, line: str, arg: int) -> None:
    err = _error(tmp_path, _replace(4, line))
    assert err.line == 4
    assert str(err).startswith(
        f"{tmp_path / 'G0.txt'}:4: found node 2 refers to node {arg}; expected an arg < 2: "
        "nodes may only refer to earlier nodes (the dump must be in topological order)"
    )


def test_negative_arg(tmp_path: Path) -> None:
    err = _error(tmp_path, _replace(5, "3 1 -1 "))
    assert err.line == 5 and "the arg -1 of node 3" in err.found
