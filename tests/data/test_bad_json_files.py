"""Whole-file JSON inputs (CLEVR's metadata / properties / templates / synonyms, the ESOL
split) and the CLEVR line files: a truncated, empty or wrongly shaped file is a
``DataFormatError`` naming ``file:line`` (never a raw ``JSONDecodeError``, ``AttributeError``
or ``ValueError``), an empty question or scene file is refused instead of read as nothing,
and a UTF-8 byte-order mark is dropped by every text loader."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edbatch.data import (
    load_conllu,
    load_esol_split,
    load_metadata,
    load_properties,
    load_questions,
    load_scenes,
    load_tagged,
    load_templates,
    load_trees,
)
from edbatch.errors import DataFormatError

__all__: list[str] = []

DATA = Path(__file__).resolve().parents[2] / "data"
CLEVR = DATA / "clevr"
META = load_metadata(CLEVR / "metadata.json")
PROPS = load_properties(CLEVR / "properties.json")

LOADERS: dict[str, tuple[Path, Callable[[Path], Any]]] = {
    "metadata": (CLEVR / "metadata.json", load_metadata),
    "properties": (CLEVR / "properties.json", load_properties),
    "esol split": (DATA / "esol" / "split.json", load_esol_split),
}


@pytest.mark.parametrize("name", sorted(LOADERS))
@pytest.mark.parametrize("body, found", [
    ("", "found an empty file"),
    ("  \n\n", "found an empty file"),
    (None, "found invalid JSON"),  # the real file cut in half
    ("[1, 2]", "found a JSON list"),
    ('"text"', "found a JSON str"),
])
def test_whole_file_json_errors_name_the_file_and_line(tmp_path: Path, name: str,
                                                        body: str | None, found: str) -> None:
    src, load = LOADERS[name]
    path = tmp_path / src.name
    text = src.read_text(encoding="utf-8")
    path.write_text(text[: len(text) // 2] if body is None else body, encoding="utf-8")
    with pytest.raises(DataFormatError, match=found) as e:
        load(path)
    assert e.value.path == str(path) and e.value.line >= 1
    assert str(e.value).startswith(f"{path}:{e.value.line}: ")


def _metadata_edited(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    data = json.loads((CLEVR / "metadata.json").read_text(encoding="utf-8"))
    edit(data)
    path = tmp_path / "metadata.json"
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


@pytest.mark.parametrize("edit, found", [
    (lambda d: d["types"].pop("Color"), r"function 'filter_color' with side_inputs \['Color'\]"),
    (lambda d: d["types"].update(Integer=1.5), "type 'Integer' with values 1.5"),
    (lambda d: d["types"].update(Shape=["cube", 3]), r"type 'Shape' with values \['cube', 3\]"),
    (lambda d: d["types"].update(Relation=[]), "side input type 'Relation' of no values"),
    (lambda d: d["functions"][1].update(inputs=-1), "function 'filter_color' with inputs -1"),
    (lambda d: d["functions"][5].update(output="Thing"), "function 'unique' with output"),
    (lambda d: d["functions"][3].update(name=7), "function 3 named 7"),
    (lambda d: d["functions"].__setitem__(0, 1.5), "function 0 with a JSON float"),
])
def test_metadata_types_and_functions_are_checked(tmp_path: Path, edit: Any, found: str) -> None:
    """What the module types are made of is checked when read (a KeyError or TypeError
    at the first use before), naming the line of the type or function where it has one."""
    path = _metadata_edited(tmp_path, edit)
    with pytest.raises(DataFormatError, match=found) as e:
        load_metadata(path)
    if "function 0" not in found and "named" not in found:  # (those have no name to find)
        assert e.value.line > 1  # (the pretty-printed file: the entry's line)


@pytest.mark.parametrize("entry", ['"7"', "1.5", "true", "null"])
def test_esol_split_entries_must_be_integers(tmp_path: Path, entry: str) -> None:
    data = json.loads((DATA / "esol" / "split.json").read_text(encoding="utf-8"))
    text = json.dumps(data).replace('"valid": [', f'"valid": [{entry}, ', 1)
    (tmp_path / "split.json").write_text(text, encoding="utf-8")
    with pytest.raises(DataFormatError, match=f"the entry {json.loads(entry)!r} in 'valid'"):
        load_esol_split(tmp_path / "split.json")


@pytest.mark.parametrize("body", ["", "\n  \n"])
def test_empty_question_and_scene_files_are_refused(tmp_path: Path, body: str) -> None:
    (tmp_path / "q.jsonl").write_text(body, encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"q\.jsonl:1: found an empty file \(no questions"):
        load_questions(tmp_path / "q.jsonl", META)
    (tmp_path / "s.jsonl").write_text(body, encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"s\.jsonl:1: found an empty file \(no scenes"):
        load_scenes(tmp_path / "s.jsonl", PROPS)


def test_a_question_template_index_must_be_an_integer(tmp_path: Path) -> None:
    line = (CLEVR / "val_questions.jsonl").read_text(encoding="utf-8").splitlines()[0]
    bad = json.dumps({**json.loads(line), "template": "abc"})
    (tmp_path / "q.jsonl").write_text(line + "\n" + bad + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"q\.jsonl:2: found template 'abc'"):
        load_questions(tmp_path / "q.jsonl", META)


@pytest.mark.parametrize("body, found", [
    ("{}", "found a JSON dict"),
    ('[{"text": []}]', "found template 0 = "),
    ("[1", "found invalid JSON"),
])
def test_bad_template_files(tmp_path: Path, body: str, found: str) -> None:
    folder = tmp_path / "templates"
    folder.mkdir()
    (folder / "bad.json").write_text(body, encoding="utf-8")
    with pytest.raises(DataFormatError, match=found):
        load_templates(folder, META)


@pytest.mark.parametrize("src, load, suffix", [
    (DATA / "trees" / "dev.txt", load_trees, ".txt"),
    (DATA / "tags" / "dev.txt", load_tagged, ".txt"),
    (DATA / "ud_ewt" / "en_ewt-ud-dev.conllu", load_conllu, ".conllu"),
    (CLEVR / "val_scenes.jsonl", lambda p: load_scenes(p, PROPS), ".jsonl"),
    (CLEVR / "properties.json", load_properties, ".json"),
])
def test_a_utf8_byte_order_mark_is_dropped(tmp_path: Path, src: Path, load: Callable[[Path], Any],
                                           suffix: str) -> None:
    """A BOM (Windows editors write one) reads as the same file, not as a first word
    '\\ufeff...' (SST, CoNLL-U: refused; tagger: glued to the first word)."""
    plain, bom = tmp_path / f"plain{suffix}", tmp_path / f"bom{suffix}"
    shutil.copy(src, plain)
    bom.write_bytes(b"\xef\xbb\xbf" + src.read_bytes())
    got, want = load(bom), load(plain)
    if hasattr(want, "__iter__"):  # a Treebank's repr names its path: compare its items
        got, want = list(got), list(want)
    assert repr(got) == repr(want).replace(str(plain), str(bom))  # (sentences name the file)
