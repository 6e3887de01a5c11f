"""Tests of the CLEVR scene graphs, programs, template instantiation and the stored split."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from edbatch.data import (
    ClevrObject,
    Scene,
    UndefinedAnswerError,
    execute,
    load_clevr,
    load_metadata,
    load_properties,
    load_questions,
    load_scenes,
    load_templates,
    module_type,
    parse_program,
    sample_scene,
    scene_features,
    write_splits,
)
from edbatch.data.clevr_programs import answer_text
from edbatch.data.clevr_templates import instantiate
from edbatch.data.generate import main
from edbatch.errors import DataFormatError

DATA = Path(__file__).resolve().parents[2] / "data" / "clevr"
META = load_metadata(DATA / "metadata.json")
PROPS = load_properties(DATA / "properties.json")

# 0 large red metal cube (0, 0); 1 small blue rubber sphere (1, 1): right of / behind 0;
# 2 small red rubber cylinder (-1, 2): left of / behind 0 and 1; 3 large blue metal sphere
# (2, -1): right of / in front of 0.
SCENE = Scene.from_objects((
    ClevrObject("cube", "red", "metal", "large", 0.0, 0.0),
    ClevrObject("sphere", "blue", "rubber", "small", 1.0, 1.0),
    ClevrObject("cylinder", "red", "rubber", "small", -1.0, 2.0),
    ClevrObject("sphere", "blue", "metal", "large", 2.0, -1.0),
))
S = ["scene", [], None]


def _run(raw: list) -> str:
    return answer_text(execute(parse_program(raw, META), SCENE)[-1])


def test_relations_of_hand_scene() -> None:
    assert SCENE.relations["right"][0] == (1, 3)
    assert SCENE.relations["left"][0] == (2,)
    assert SCENE.relations["behind"][0] == (1, 2)
    assert SCENE.relations["front"][0] == (3,)
    assert SCENE.relations["behind"][1] == (2,)


def test_scene_features() -> None:
    feats = scene_features(SCENE, PROPS)
    assert feats.shape == (4, 17) and feats.dtype.name == "float32"
    assert (feats[:, :15].sum(axis=1) == 4).all()
    # size large is index 0 of properties.json's sizes, colour red index 1 (offset 2)
    assert feats[0, 0] == 1 and feats[0, 2 + 1] == 1 and feats[1, 1] == 1
    assert list(feats[3, 15:]) == pytest.approx([2 / 3, -1 / 3])


@pytest.mark.parametrize(
    ("raw", "answer"),
    [
        ([S, ["filter_color", [0], "red"], ["count", [1], None]], "2"),
        ([S, ["filter_shape", [0], "sphere"], ["filter_size", [1], "small"], ["unique", [2], None],
          ["relate", [3], "behind"], ["unique", [4], None], ["query_shape", [5], None]],
         "cylinder"),
        ([S, ["filter_shape", [0], "cube"], ["unique", [1], None], ["same_color", [2], None],
          ["unique", [3], None], ["query_material", [4], None]], "rubber"),
        ([S, ["filter_shape", [0], "cube"], ["unique", [1], None], ["same_material", [2], None],
          ["filter_shape", [3], "cube"], ["exist", [4], None]], "no"),
        ([S, ["filter_color", [0], "red"], S, ["filter_shape", [2], "sphere"],
          ["union", [1, 3], None], ["count", [4], None]], "4"),
        ([S, ["filter_color", [0], "red"], S, ["filter_material", [2], "rubber"],
          ["intersect", [1, 3], None], ["unique", [4], None], ["query_shape", [5], None]],
         "cylinder"),
        ([S, ["filter_shape", [0], "cube"], ["unique", [1], None], ["query_material", [2], None],
          S, ["filter_color", [4], "blue"], ["filter_size", [5], "large"], ["unique", [6], None],
          ["query_material", [7], None], ["equal_material", [3, 8], None]], "yes"),
        ([S, ["filter_shape", [0], "cube"], ["count", [1], None], S,
          ["filter_color", [3], "red"], ["count", [4], None], ["less_than", [2, 5], None]],
         "yes"),
        ([S, ["filter_shape", [0], "cube"], ["count", [1], None], S,
          ["filter_color", [3], "red"], ["count", [4], None], ["greater_than", [2, 5], None]],
         "no"),
        ([S, ["filter_size", [0], "small"], ["count", [1], None], S,
          ["filter_color", [3], "red"], ["count", [4], None], ["equal_integer", [2, 5], None]],
         "yes"),
    ],
)
def test_executor_semantics(raw: list, answer: str) -> None:
    assert _run(raw) == answer


def test_unique_of_two_objects_is_undefined() -> None:
    with pytest.raises(UndefinedAnswerError, match=r"node 2 unique: unique of a set of 2"):
        _run([S, ["filter_color", [0], "red"], ["unique", [1], None],
              ["query_shape", [2], None]])


def test_module_types() -> None:
    types = META.module_types()
    assert len(types) == len(set(types)) == 41
    assert "filter_color[red]" in types and "relate[front]" in types and "count" in types
    _, questions = load_clevr(DATA, "train")
    used = {module_type(n) for q in questions for n in q.program}
    assert set(types) - used == {"equal_object"}


def test_stored_split() -> None:
    templates = load_templates(DATA / "templates", META)
    assert len(templates) == 90
    sizes = {}
    for split in ("train", "val", "test"):
        scenes, questions = load_clevr(DATA, split)  # recomputes and checks every answer
        sizes[split] = (len(scenes), len(questions))
        for q in questions:
            assert answer_text(execute(q.program, scenes[q.scene])[-1]) == q.answer
        per_scene = Counter(q.scene for q in questions)
        assert max(per_scene.values()) == 10
        for scene in scenes:
            n = len(scene.objects)
            assert 3 <= n <= 10
            for i in range(n):
                for j in range(n):
                    if i != j:  # every pair is clearly left/right and front/behind
                        assert (j in scene.relations["left"][i]) != (
                            j in scene.relations["right"][i])
                        assert (j in scene.relations["left"][i]) == (
                            i in scene.relations["right"][j])
                        assert (j in scene.relations["behind"][i]) == (
                            i in scene.relations["front"][j])
                        a, b = scene.objects[i], scene.objects[j]
                        assert abs(a.x - b.x) >= 0.4 - 1e-9 and abs(a.y - b.y) >= 0.4 - 1e-9
        if split == "train":
            assert {(q.family, q.template) for q in questions} == {
                (t.family, t.index) for t in templates}
            answers = Counter(q.answer for q in questions)
            assert abs(answers["yes"] - answers["no"]) < 0.1 * (answers["yes"] + answers["no"])
    assert sizes == {"train": (400, 4000), "val": (50, 500), "test": (50, 500)}


def test_regeneration_is_bit_identical(tmp_path: Path) -> None:
    sizes = {"train": 60, "val": 20}
    write_splits(DATA, tmp_path / "a", seed=3, sizes=sizes)
    write_splits(DATA, tmp_path / "b", seed=3, sizes=sizes)
    write_splits(DATA, tmp_path / "c", seed=4, sizes=sizes)
    for name in ("train_scenes.jsonl", "train_questions.jsonl", "val_questions.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()
    _, questions = load_clevr(tmp_path / "a", "train", data=DATA)
    assert len(questions) == 60


@pytest.mark.slow
def test_stored_split_regenerates_exactly(tmp_path: Path) -> None:
    main(["clevr", "--out", str(tmp_path)])
    for path in sorted(tmp_path.iterdir()):
        assert path.read_bytes() == (DATA / path.name).read_bytes(), path.name


def test_every_template_instantiates_with_its_constraints() -> None:
    rng = random.Random(0)
    scenes = [sample_scene(rng, PROPS) for _ in range(20)]
    synonyms = json.loads((DATA / "synonyms.json").read_text())
    for t in load_templates(DATA / "templates", META):
        got = next(filter(None, (instantiate(t, s, rng, META, synonyms)
                                 for s in scenes for _ in range(10))), None)
        assert got is not None, (t.family, t.index)
        text, program, answer = got
        assert "<" not in text and "[" not in text
        nulls = [p for c in t.constraints if c["type"] == "NULL" for p in c["params"]]
        assert len(program) >= 2 and answer
        if t.family == "zero_hop" and nulls:  # a queried attribute is never named
            attr = t.param_types[nulls[0]].lower()
            assert not any(n.function == f"filter_{attr}" for n in program[:-1])


def _questions(tmp_path: Path, program: list, **extra: object) -> Path:
    good = {"scene": 0, "family": "f", "template": 0, "question": "q?",
            "program": [S, ["count", [0], None]], "answer": "4"}
    bad = {**good, "program": program, **extra}
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("program", "extra", "needle"),
    [
        ([S, ["filter_colour", [0], "red"], ["count", [1], None]], {},
         "q.jsonl:2: found program node 1: unknown function 'filter_colour'"),
        ([S, ["filter_colour", [0], "red"], ["count", [1], None]], {},
         "Did you mean 'filter_color'"),
        ([S, ["filter_unique", [0], None], ["query_color", [1], None]], {},
         "q.jsonl:2: found program node 1: template-only function 'filter_unique'"),
        ([S, ["count", [0, 0], None]], {},
         "q.jsonl:2: found program node 1 'count' with 2 input(s) [0, 0]; expected arity 1"),
        ([S, ["relate", [], "left"], ["count", [1], None]], {}, "expected arity 1 (Object)"),
        ([S, ["query_color", [0], None]], {},
         "node 1 'query_color' input 0 = node 0 of type ObjectSet; expected type Object"),
        ([S, ["filter_color", [0], "pink"], ["count", [1], None]], {},
         "node 1 'filter_color' with value 'pink'; expected one of gray, red"),
        ([S, ["count", [0], "red"]], {}, "expected no value (null)"),
        ([S, ["count", [2], None], ["exist", [0], None]], {}, "input 2; expected the index"),
        ([S, ["filter_color", [0], "red"]], {}, "last program node 'filter_color'"),
        ([["scene"]], {}, "program node 0 = \"['scene']\""),
        ([S, ["count", [0], None]], {"scene": 5}, "q.jsonl:2: found scene index 5"),
    ],
)
def test_bad_programs(tmp_path: Path, program: list, extra: dict, needle: str) -> None:
    with pytest.raises(DataFormatError) as err:
        load_questions(_questions(tmp_path, program, **extra), META, n_scenes=1)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_question_key(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text('{"scene": 0, "program": []}\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"q.jsonl:1: found a question without family, "
                       r"template, question, answer"):
        load_questions(path, META)


@pytest.mark.parametrize(
    ("obj", "needle"),
    [
        ({"shape": "cube", "material": "metal", "size": "large", "x": 0, "y": 0},
         "s.jsonl:2: found object 1 without attribute 'color'"),
        ({"shape": "cube", "color": "pink", "material": "metal", "size": "large", "x": 0,
          "y": 0}, "s.jsonl:2: found object 1 color 'pink'; expected one of gray, red"),
        ({"shape": "cube", "color": "red", "material": "metal", "size": "large", "x": "a",
          "y": 0}, "s.jsonl:2: found object 1 x 'a'; expected a number"),
    ],
)
def test_bad_scenes(tmp_path: Path, obj: dict, needle: str) -> None:
    good = {"shape": "cube", "color": "red", "material": "metal", "size": "large", "x": 1,
            "y": 1}
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"objects": [good]}) + "\n"
                    + json.dumps({"objects": [good, obj]}) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        load_scenes(path, PROPS)
    assert needle in str(err.value)
    path.write_text("{not json\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match="s.jsonl:1: found invalid JSON"):
        load_scenes(path, PROPS)


def test_stored_answer_must_match(tmp_path: Path) -> None:
    scene = SCENE.to_json()
    (tmp_path / "x_scenes.jsonl").write_text(scene + "\n", encoding="utf-8")
    q = {"scene": 0, "family": "f", "template": 0, "question": "q?",
         "program": [S, ["filter_color", [0], "red"], ["count", [1], None]], "answer": "2"}
    bad = {**q, "answer": "3"}
    undefined = {**q, "program": [S, ["unique", [0], None], ["query_color", [1], None]]}
    path = tmp_path / "x_questions.jsonl"
    path.write_text(json.dumps(q) + "\n", encoding="utf-8")
    assert load_clevr(tmp_path, "x", data=DATA)[1][0].answer == "2"
    path.write_text(json.dumps(q) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"x_questions.jsonl:2: found stored answer '3' "
                       r"but the program gives '2'"):
        load_clevr(tmp_path, "x", data=DATA)
    path.write_text(json.dumps(undefined) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"x_questions.jsonl:1: .*unique of a set of 4"):
        load_clevr(tmp_path, "x", data=DATA)
