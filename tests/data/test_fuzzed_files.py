"""Seeded fuzzing of every file door: slices of the real data files and policy artifacts,
each mutated once (a line cut, replaced, duplicated or dropped, a number swapped, bytes
that are no UTF-8, a JSON field deleted or retyped), then read. A read either succeeds or
raises an edbatch error (``DataFormatError``, ``PolicyFileError``...) that names the
file: never a raw ``TypeError`` / ``KeyError`` / ``OverflowError`` (each one such a fuzz
found is fixed and listed in docs/errors.md). What a mutated file may still hold (a valid
number swapped for another) is not checked here; the loaders' own tests do that."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edbatch import data as d
from edbatch.errors import EdbatchError

DATA = Path(__file__).resolve().parents[2] / "data"
META = d.load_metadata(DATA / "clevr" / "metadata.json")
PROPS = d.load_properties(DATA / "clevr" / "properties.json")

#: name -> (source file, lines kept, loader of a path)
LINE_FILES: dict[str, tuple[Path, int, Callable[[Path], Any]]] = {
    "sst": (DATA / "trees" / "dev.txt", 40, d.load_trees),
    "tags": (DATA / "tags" / "dev.txt", 40, d.load_tagged),
    "conllu": (DATA / "ud_ewt" / "en_ewt-ud-dev.conllu", 300, d.load_conllu),
    "lattices": (DATA / "lattice" / "dev.txt", 300, d.load_lattices),
    "pairs": (DATA / "iwslt15" / "tst2012.en-vi.capped", 40, d.load_pairs),
    "esol": (DATA / "esol" / "delaney-processed.csv", 60, d.load_esol),
    "questions": (DATA / "clevr" / "val_questions.jsonl", 30,
                  lambda p: d.load_questions(p, META)),
    "scenes": (DATA / "clevr" / "val_scenes.jsonl", 20, lambda p: d.load_scenes(p, PROPS)),
    "dump": (DATA / "graphs" / "bilstm_B1" / "G0.txt", 10 ** 6, d.load_dump),
}
KINDS = ("cut", "garbage", "drop", "dup", "number", "negative", "bytes", "empty", "fields")


def _mutate(lines: list[str], kind: str, rng: random.Random) -> bytes:
    i = rng.randrange(len(lines))
    if kind == "cut":
        text = "\n".join(lines)
        return text[:rng.randrange(1, len(text))].encode()
    if kind == "garbage":
        lines[i] = "@@ ( ) ] } zz 9x -- \"\\"
    elif kind == "drop":
        del lines[i]
    elif kind == "dup":
        lines.insert(i, lines[i])
    elif kind in ("number", "negative"):
        big = rng.choice([10 ** 12, 99999, 0, -1]) if kind == "number" else -7
        lines[i] = re.sub(r"\d+", str(big), lines[i], count=rng.randrange(1, 3))
    elif kind == "bytes":
        return "\n".join(lines).encode()[:200] + bytes(rng.randrange(128, 256)
                                                          for _ in range(8)) + b"\n"
    elif kind == "empty":
        return b""
    elif kind == "fields":
        parts = re.split(r"([\t ,|])", lines[i])
        rng.shuffle(parts)
        lines[i] = "".join(parts)
    return "\n".join(lines).encode()


@pytest.mark.parametrize("name", sorted(LINE_FILES))
def test_mutated_data_files_read_or_name_the_file(tmp_path: Path, name: str) -> None:
    src, keep, load = LINE_FILES[name]
    lines = src.read_text(encoding="utf-8").split("\n")
    if name == "conllu":  # whole sentences: cut at a blank line
        keep = max(i for i, line in enumerate(lines[:keep]) if not line)
    head = lines[:keep]
    for seed in range(24):
        rng = random.Random(f"{name}{seed}")
        kind = KINDS[seed % len(KINDS)]
        path = tmp_path / f"{seed}{src.suffix}"
        path.write_bytes(_mutate(list(head), kind, rng))
        _read_or_named(load, path, f"{name} {kind} seed {seed}")


def _read_or_named(load: Callable[[Path], Any], path: Path, what: str) -> None:
    """``load(path)`` succeeds or raises an edbatch error naming ``path``; anything else
    fails the test naming ``what`` (the mutation)."""
    try:
        load(path)
    except EdbatchError as e:
        assert str(path) in str(e), (what, e)
    except Exception as e:
        pytest.fail(f"{what}: raw {type(e).__name__}: {e}")


def _json_paths(doc: Any, at: list[Any], out: list[list[Any]]) -> list[list[Any]]:
    out.append(at)
    items = doc.items() if isinstance(doc, dict) else enumerate(doc[:6]) \
        if isinstance(doc, list) else ()
    for k, v in items:
        _json_paths(v, [*at, k], out)
    return out


def _artifacts(tmp_path: Path) -> dict[str, Path]:
    from edbatch.workloads.synthetic import synthetic_vocab
    from policies import FSMPolicy
    from policies.afterstate import AfterstatePolicy, afterstate_start
    from policies.priority import PriorityPolicy, critical_path_weights
    from policies.priority_fsm import PriorityFSM, RankKey

    vocab = synthetic_vocab(3)
    return {
        "fsm": FSMPolicy({(0,): 0, (1, 2): 1}, "base", vocab.names).save(tmp_path / "f.json"),
        "priority": PriorityPolicy(critical_path_weights()).save(tmp_path / "p.json"),
        "afterstate": AfterstatePolicy(afterstate_start()).save(tmp_path / "a.json"),
        "priority_fsm": PriorityFSM(RankKey(2, ("wait_gain",), ((0.25,),)),
                                    {(2, 0, 1): 1}).save(tmp_path / "r.json"),
    }


VALUES = ["zzz", -1, None, [], {}, 10 ** 12, 1.5, float("nan"), True, "frobnicate"]
JSON_FILES: dict[str, tuple[Path, Callable[[Path], Any]]] = {
    "metadata": (DATA / "clevr" / "metadata.json", d.load_metadata),
    "properties": (DATA / "clevr" / "properties.json", d.load_properties),
    "esol split": (DATA / "esol" / "split.json", d.load_esol_split),
}


def _mutated_json(doc: Any, seed: int, name: str) -> tuple[list[Any], Any]:
    rng = random.Random(f"{name}{seed}")
    mutated = json.loads(json.dumps(doc))
    at = rng.choice(_json_paths(doc, [], [])[1:])
    parent = mutated
    for k in at[:-1]:
        parent = parent[k]
    if seed % 4 == 0:
        del parent[at[-1]]
    else:
        parent[at[-1]] = rng.choice(VALUES)
    return at, mutated


@pytest.mark.parametrize("name", sorted(JSON_FILES))
def test_mutated_json_data_files_read_or_name_the_file(tmp_path: Path, name: str) -> None:
    src, load = JSON_FILES[name]
    doc = json.loads(src.read_text(encoding="utf-8"))
    for seed in range(40):
        at, mutated = _mutated_json(doc, seed, name)
        path = tmp_path / f"{seed}.json"
        path.write_text(json.dumps(mutated, indent=1))
        _read_or_named(load, path, f"{name} {at} seed {seed}")


def test_mutated_policy_files_load_or_name_the_file(tmp_path: Path) -> None:
    from policies import load_policy

    for name, src in _artifacts(tmp_path).items():
        doc = json.loads(src.read_text())
        for seed in range(40):
            at, mutated = _mutated_json(doc, seed, name)
            path = tmp_path / f"{name}{seed}.json"
            path.write_text(json.dumps(mutated))
            _read_or_named(load_policy, path, f"{name} {at} seed {seed}")
