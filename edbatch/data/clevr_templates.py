"""CLEVR question templates instantiated over sampled scene graphs, and the split generator.

Templates (``data/clevr/templates/*.json``, CLEVR 1.0) are small programs over template
functions (``filter_unique``, ``relate_filter_count``, ...) with parameters ``<Z> <C> <M> <S>``
(size, colour, material, shape; may be null = not mentioned) and ``<R>`` (relation). Our
instantiation, written for edbatch:

1. walk the template's nodes in order, executing as we go on the scene;
2. at a node with parameters, choose them from the node's input set: for ``*_unique`` pick a
   target object and add its attributes in random order until it is the only match (then
   each unused attribute with probability 1/4); for plain filters each attribute is null
   with probability 1/2, else the value of a random input object (3/4) or a random value
   (1/4, and always when the set is empty); a relation is uniform; ``NULL``-constrained
   parameters stay null;
3. template functions expand into program functions (``relate_filter_count[R,Z,C,M,S]`` ->
   ``relate[R]``, ``filter_size[Z]`` ..., ``count``; null attributes give no node);
4. reject the draw if a ``unique`` sees a set of size != 1 or an ``OUT_NEQ`` (two nodes'
   values equal) or ``NEQ`` (two parameters equal) constraint fails; yes/no answers are kept
   balanced per template (an answer is rejected when it leads the other by more than 2).
   ``OUT_NEQ`` on ``filter_count`` / ``filter_exist`` nodes compares the two filtered *sets*
   (our reading: "are there as many red cubes as red cubes" is what it excludes; comparing
   the counts would make every ``equal_integer`` answer "no").

The answer stored is recomputed by :func:`edbatch.data.clevr_programs.execute` on the expanded
program. Regenerate the stored split bit for bit with::

    python -m edbatch.data.generate clevr --out data/clevr --seed 0
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from edbatch.data._text import read_json, shorten
from edbatch.data.clevr_programs import (
    Metadata,
    ProgramNode,
    Question,
    UndefinedAnswerError,
    answer_text,
    apply,
    dump_questions,
    execute,
    load_metadata,
    load_questions,
)
from edbatch.data.clevr_scenes import (
    RELATIONS,
    Properties,
    Scene,
    dump_scenes,
    load_properties,
    load_scenes,
    sample_scene,
)
from edbatch.errors import DataFormatError

__all__ = ["SPLITS", "Template", "generate_split", "instantiate", "load_clevr",
           "load_templates", "write_splits"]

#: Default split sizes (questions) of the stored data.
SPLITS: dict[str, int] = {"train": 4000, "val": 500, "test": 500}
_ATTR_OF_TYPE = {"Size": "size", "Color": "color", "Material": "material", "Shape": "shape"}


@dataclass(frozen=True)
class Template:
    """One CLEVR template: family (file stem), index in the file, texts, nodes, params."""

    family: str
    index: int
    texts: tuple[str, ...]
    nodes: tuple[dict, ...]
    param_types: dict[str, str]
    constraints: tuple[dict, ...]


def load_templates(folder: str | Path, meta: Metadata) -> list[Template]:
    """Load every ``*.json`` template file of ``folder`` (sorted by name).

    Raises:
        DataFormatError: If a template uses a function missing from ``meta`` or a parameter
            it does not declare.
    """
    out = []
    for path in sorted(Path(folder).glob("*.json")):
        templates = read_json(path, "a JSON list of CLEVR question templates")
        if not isinstance(templates, list):
            raise DataFormatError(path, 1, f"a JSON {type(templates).__name__}",
                                  "a JSON list of CLEVR question templates")
        for k, t in enumerate(templates):
            keys = ("text", "nodes", "params", "constraints")
            if not isinstance(t, dict) or any(key not in t for key in keys):
                raise DataFormatError(path, 1, f"template {k} = {shorten(str(t))}",
                                      f"an object with the keys {', '.join(keys)}")
            types = {p["name"]: p["type"] for p in t["params"]}
            for node in t["nodes"]:
                if node["type"] not in meta.functions:
                    raise DataFormatError(path, 1, f"template {k}: unknown function "
                                          f"{node['type']!r}", "a function of metadata.json")
                for name in node.get("side_inputs", ()):
                    if name not in types:
                        raise DataFormatError(path, 1, f"template {k}: undeclared parameter "
                                              f"{name!r}", f"one of {sorted(types)}")
            out.append(Template(path.stem, k, tuple(t["text"]), tuple(t["nodes"]), types,
                                tuple(t["constraints"])))
    return out


def _choose_unique(rng: random.Random, base: frozenset, scene: Scene, names: list[str],
                   types: dict[str, str], params: dict, null: set) -> bool:
    """Describe one object of ``base`` uniquely with the free attribute parameters."""
    if not base:
        return False
    target = rng.choice(sorted(base))
    free = [n for n in names if n not in null and n not in params]
    rng.shuffle(free)
    chosen = {n: params[n] for n in names if params.get(n) is not None}
    obj = scene.objects[target]

    def matches(desc: dict) -> frozenset:
        return frozenset(i for i in base if all(
            getattr(scene.objects[i], _ATTR_OF_TYPE[types[n]]) == v for n, v in desc.items()))

    if any(getattr(obj, _ATTR_OF_TYPE[types[n]]) != v for n, v in chosen.items()):
        return False
    rest = []
    for n in free:
        if len(matches(chosen)) == 1:
            rest.append(n)
            continue
        chosen[n] = getattr(obj, _ATTR_OF_TYPE[types[n]])
    if matches(chosen) != {target}:
        return False
    for n in rest:
        chosen[n] = getattr(obj, _ATTR_OF_TYPE[types[n]]) if rng.random() < 0.25 else None
    for n in names:
        params.setdefault(n, chosen.get(n))
    return True


def _choose_filter(rng: random.Random, base: frozenset, scene: Scene, names: list[str],
                   types: dict[str, str], params: dict, null: set, meta: Metadata) -> None:
    """Choose attribute parameters of a plain filter (null, an input object's, or random)."""
    for n in names:
        if n in params:
            continue
        if n in null or rng.random() < 0.5:
            params[n] = None
        elif base and rng.random() < 0.75:
            params[n] = getattr(scene.objects[rng.choice(sorted(base))], _ATTR_OF_TYPE[types[n]])
        else:
            params[n] = rng.choice(meta.types[types[n]])


def _expand(fn: str, side: list[str], params: dict) -> list[tuple[str, str | None]]:
    """Program steps ``(function, value)`` of one template node (chain after the input)."""
    if fn == "scene":
        return [("scene", None)]
    steps: list[tuple[str, str | None]] = []
    attrs = side
    if fn.startswith("relate_filter") or fn == "relate":
        steps.append(("relate", params[side[0]]))
        attrs = side[1:]
    if fn.startswith("filter") or fn.startswith("relate_filter"):
        # "filter:<param>" is resolved to filter_<attribute> by the caller's type map
        steps += [(f"filter:{n}", params[n]) for n in attrs if params[n] is not None]
        suffix = fn.rpartition("filter")[2].lstrip("_")
        if suffix in ("unique", "count", "exist"):
            steps.append((suffix, None))
        return steps
    if fn == "relate":
        return steps
    return [(fn, None)]


def _choose_params(t: Template, fn: str, side: list[str], base: object, scene: Scene,
                   rng: random.Random, meta: Metadata, params: dict) -> object | None:
    """Choose the parameters of one template node; return the set its filters act on
    (``None`` if no description of a unique object exists)."""
    null = {p for c in t.constraints if c["type"] == "NULL" for p in c["params"]}
    if fn.startswith("relate_filter") or fn == "relate":
        params.setdefault(side[0], rng.choice(RELATIONS))
        if fn.startswith("relate_filter"):
            base = frozenset(scene.relations[params[side[0]]][base])
    names = [n for n in side if t.param_types[n] != "Relation"]
    if names and fn.endswith("unique"):
        if not _choose_unique(rng, base, scene, names, t.param_types, params, null):
            return None
    elif names:
        _choose_filter(rng, base, scene, names, t.param_types, params, null, meta)
    return base


def _run_steps(t: Template, steps: list, inputs: tuple[int, ...], scene: Scene,
               program: list[ProgramNode], values: list[object]) -> bool:
    """Append and execute the program nodes of one template node; False if undefined."""
    for step, value in steps:
        if step.startswith("filter:"):
            step = "filter_" + _ATTR_OF_TYPE[t.param_types[step[7:]]]
        node = ProgramNode(step, inputs, value)
        try:
            values.append(apply(node, [values[j] for j in inputs], scene))
        except UndefinedAnswerError:
            return False
        program.append(node)
        inputs = (len(program) - 1,)
    return True


def instantiate(t: Template, scene: Scene, rng: random.Random, meta: Metadata,
                synonyms: dict[str, list[str]]) -> tuple[str, tuple[ProgramNode, ...], str] | None:
    """Fill ``t``'s parameters on ``scene``; return (text, program, answer) or None (reject)."""
    params: dict[str, str | None] = {}
    outputs: list[object] = []
    index: list[int] = []  # template node -> program node
    program: list[ProgramNode] = []
    values: list[object] = []
    compared: list[object] = []  # what OUT_NEQ compares: the set before a count/exist
    for node in t.nodes:
        fn, side, ins = node["type"], list(node.get("side_inputs", ())), list(node["inputs"])
        base = outputs[ins[0]] if ins else None
        if side and _choose_params(t, fn, side, base, scene, rng, meta, params) is None:
            return None
        steps = _expand(fn, side, params)
        if not steps:  # a single-attribute filter with a null parameter: pass-through
            outputs.append(outputs[ins[0]])
            compared.append(outputs[ins[0]])
            index.append(index[ins[0]])
            continue
        if not _run_steps(t, steps, tuple(index[j] for j in ins), scene, program, values):
            return None
        outputs.append(values[-1])
        if meta.functions[fn].template_only and steps[-1][0] in ("count", "exist"):
            compared.append(values[-2] if len(steps) > 1 else outputs[ins[0]])
        else:
            compared.append(values[-1])
        index.append(len(program) - 1)
    for c in t.constraints:
        if c["type"] == "OUT_NEQ" and compared[c["params"][0]] == compared[c["params"][1]]:
            return None
        if c["type"] == "NEQ" and params.get(c["params"][0]) == params.get(c["params"][1]):
            return None
    return _render(t, rng, params, synonyms), tuple(program), answer_text(values[-1])


def _render(t: Template, rng: random.Random, params: dict, synonyms: dict) -> str:
    """Question text: a random phrasing, optional ``[words]`` kept half the time."""
    text = rng.choice(t.texts)
    text = re.sub(r"\[([^\]]*)\]", lambda m: m.group(1) if rng.random() < 0.5 else "", text)
    for name in sorted(t.param_types, key=len, reverse=True):
        value = params.get(name)
        if value is None:
            word = "thing" if t.param_types[name] == "Shape" else ""
        else:
            word = rng.choice(synonyms.get(value, [value]))
        text = text.replace(name, word)
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(r" ([?;,])", r"\1", text)


def generate_split(n_questions: int, rng: random.Random, props: Properties, meta: Metadata,
                   templates: list[Template], synonyms: dict, per_scene: int = 10,
                   max_tries: int = 200) -> tuple[list[Scene], list[Question]]:
    """Sample scenes and ``per_scene`` distinct questions on each until ``n_questions``.

    Each question slot picks a template family uniformly (so the 28 ``same_relate``
    templates do not dominate) and tries up to 10 of its templates before drawing another.
    """
    scenes: list[Scene] = []
    questions: list[Question] = []
    answers: dict[tuple[str, int], Counter] = {}
    families: dict[str, list[Template]] = {}
    for t in templates:
        families.setdefault(t.family, []).append(t)
    names = sorted(families)
    while len(questions) < n_questions:
        scene = sample_scene(rng, props)
        seen: set = set()
        for k in range(max_tries):
            if len(seen) == per_scene or len(questions) == n_questions:
                break
            if k % 10 == 0:  # a uniform family, then 10 tries of its templates
                family = families[rng.choice(names)]
            t = rng.choice(family)
            got = instantiate(t, scene, rng, meta, synonyms)
            if got is None or got[1] in seen:
                continue
            text, program, answer = got
            counts = answers.setdefault((t.family, t.index), Counter())
            if answer in ("yes", "no"):
                other = "no" if answer == "yes" else "yes"
                if counts[answer] > counts[other] + 2:
                    continue
            counts[answer] += 1
            seen.add(program)
            questions.append(Question(len(scenes), t.family, t.index, text, program, answer))
        scenes.append(scene)
    return scenes, questions


def write_splits(folder: str | Path, out: str | Path, seed: int,
                 sizes: dict[str, int] | None = None, per_scene: int = 10) -> None:
    """Generate every split from the CLEVR JSON in ``folder`` and write it to ``out``.

    Files: ``{split}_scenes.jsonl`` and ``{split}_questions.jsonl``. Each split draws from
    ``random.Random(f"clevr-{split}-{seed}")``, so a split does not depend on the others.
    """
    folder, out = Path(folder), Path(out)
    props = load_properties(folder / "properties.json")
    meta = load_metadata(folder / "metadata.json")
    templates = load_templates(folder / "templates", meta)
    synonyms = read_json(folder / "synonyms.json", "CLEVR's synonyms.json (an object)")
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (sizes or SPLITS).items():
        rng = random.Random(f"clevr-{split}-{seed}")
        scenes, questions = generate_split(n, rng, props, meta, templates, synonyms, per_scene)
        dump_scenes(scenes, out / f"{split}_scenes.jsonl")
        dump_questions(questions, out / f"{split}_questions.jsonl")


def load_clevr(folder: str | Path, split: str, data: str | Path | None = None
               ) -> tuple[list[Scene], list[Question]]:
    """Load one stored split: its scenes and its validated questions.

    Args:
        folder: Folder with ``{split}_scenes.jsonl`` and ``{split}_questions.jsonl``.
        split: ``train``, ``val`` or ``test``.
        data: Folder with ``properties.json`` and ``metadata.json`` (default: ``folder``).

    Raises:
        DataFormatError: For a malformed scene or question line (names ``file:line``), or a
            stored answer that differs from the program's answer on its scene.
    """
    folder = Path(folder)
    data = Path(data) if data is not None else folder
    props = load_properties(data / "properties.json")
    meta = load_metadata(data / "metadata.json")
    scenes = load_scenes(folder / f"{split}_scenes.jsonl", props)
    path = folder / f"{split}_questions.jsonl"
    questions = load_questions(path, meta, len(scenes))
    for line, q in enumerate(questions, 1):
        try:
            got = answer_text(execute(q.program, scenes[q.scene])[-1])
        except UndefinedAnswerError as exc:
            raise DataFormatError(path, line, str(exc), "a program with a defined answer",
                                  "regenerate the split") from None
        if got != q.answer:
            raise DataFormatError(path, line, f"stored answer {q.answer!r} but the program "
                                  f"gives {got!r}", "the program's answer", "regenerate the split")
    return scenes, questions
