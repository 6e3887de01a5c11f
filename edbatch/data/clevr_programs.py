"""CLEVR functional programs: representation, validation and an executor on scene graphs.

A program is a list of nodes in topological order; node ``i`` has a ``function`` (a
non-template function of CLEVR's ``metadata.json``), ``inputs`` (indices of earlier nodes) and
at most one ``value`` side input (e.g. ``filter_color`` with ``"red"``, ``relate`` with
``"left"``). The last node is terminal (count, exist, query_*, equal_*, less_than,
greater_than) and gives the answer.

Semantics (our implementation of the meaning metadata.json gives the functions):
``scene`` = all objects; ``filter_<a>[v]`` keeps the objects whose attribute ``a`` is ``v``;
``unique`` = the only object of a one-object set (else the answer is undefined);
``relate[r]`` = the objects that are ``r`` of an object; ``same_<a>`` = the *other* objects
sharing attribute ``a`` with an object; ``union`` / ``intersect`` of sets; ``count``;
``exist``; ``query_<a>``; ``equal_<a>`` / ``equal_integer`` / ``equal_object`` compare;
``less_than`` / ``greater_than`` compare counts (first input against the second).

IEP (Johnson et al., 2017) has one module per function and value: :func:`module_type` gives
that name (``filter_color[red]``, ``count``).

A question file holds one JSON object per line: ``{"scene": i, "family": ..., "template": k,
"question": text, "program": [[function, [inputs...], value or null], ...], "answer": a}``
with the answer as text (``yes``/``no``, a number, or an attribute value).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edbatch.data._text import read_json, read_lines, read_text, shorten
from edbatch.data.clevr_scenes import Scene
from edbatch.errors import DataFormatError, EdbatchError, did_you_mean

__all__ = [
    "FunctionSpec",
    "Metadata",
    "ProgramNode",
    "Question",
    "UndefinedAnswerError",
    "answer_text",
    "apply",
    "dump_questions",
    "execute",
    "load_metadata",
    "load_questions",
    "module_type",
    "parse_program",
]


class UndefinedAnswerError(EdbatchError, ValueError):
    """A program has no answer on a scene (``unique`` applied to a set of size != 1)."""


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    """One function of ``metadata.json``: input types, side-input types, output type."""

    name: str
    inputs: tuple[str, ...]
    side_inputs: tuple[str, ...]
    output: str
    terminal: bool
    template_only: bool


@dataclass(frozen=True)
class Metadata:
    """CLEVR's ``metadata.json``: value vocabularies per type and the function table."""

    types: dict[str, tuple[str, ...]]
    functions: dict[str, FunctionSpec]

    def module_types(self) -> list[str]:
        """Every IEP module type: one per program function and side-input value."""
        out = []
        for f in self.functions.values():
            if f.template_only:
                continue
            if f.side_inputs:
                out += [f"{f.name}[{v}]" for v in self.types[f.side_inputs[0]]]
            else:
                out.append(f.name)
        return out


def load_metadata(path: str | Path) -> Metadata:
    """Read CLEVR's ``question_generation/metadata.json``.

    Raises:
        DataFormatError: If ``types`` or ``functions`` is missing, a type's values are not a
            list of names, or a function lacks a field or names a type ``types`` lacks
            (the message names the line of the type or function).
    """
    data = read_json(path, "CLEVR's metadata.json (an object with 'types' and 'functions')")
    if not isinstance(data, dict) or not isinstance(data.get("types"), dict) or \
            not isinstance(data.get("functions"), list):
        found = f"keys {sorted(data)}" if isinstance(data, dict) else \
            f"a JSON {type(data).__name__}"
        raise DataFormatError(path, 1, found, "'types' and 'functions'",
                              "use question_generation/metadata.json of CLEVR")
    text = read_text(path)

    def bad(name: object, found: str, expected: str) -> DataFormatError:
        at = text.find(f'"{name}"') if isinstance(name, str) else -1
        return DataFormatError(path, text.count("\n", 0, at) + 1 if at >= 0 else 1, found,
                               expected, "restore question_generation/metadata.json of CLEVR")

    types = {}
    for k, v in data["types"].items():
        if v is not None and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            raise bad(k, f"type {k!r} with values {_brief(v)}",
                      "null or a list of value names")
        types[k] = tuple(v) if v else ()
    functions = {}
    for k, f in enumerate(data["functions"]):
        if not isinstance(f, dict) or not all(key in f for key in ("name", "inputs", "output")):
            found = f"keys {sorted(f)}" if isinstance(f, dict) else f"a JSON {type(f).__name__}"
            raise DataFormatError(path, 1, f"function {k} with {found}",
                                  "'name', 'inputs' and 'output'")
        name, side = f["name"], f.get("side_inputs", [])
        if not isinstance(name, str) or not name:
            raise bad(name, f"function {k} named {_brief(name)}", "a non-empty name")
        for field, value in (("inputs", f["inputs"]), ("side_inputs", side),
                             ("output", [f["output"]])):
            if not isinstance(value, list) or not all(
                    isinstance(t, str) and t in types for t in value):
                raise bad(name, f"function {name!r} with {field} {_brief(value)}",
                          f"type names of 'types' ({', '.join(types)})")
        if side and not types[side[0]]:
            raise bad(name, f"function {name!r} with side input type {side[0]!r} of no values",
                      "a side input type that lists its values")
        functions[name] = FunctionSpec(
            name, tuple(f["inputs"]), tuple(side), f["output"],
            bool(f.get("terminal", False)), bool(f.get("template_only", False)))
    return Metadata(types, functions)


def _brief(value: object) -> str:
    """``repr(value)`` cut to about 60 characters, for a message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


@dataclass(frozen=True, slots=True)
class ProgramNode:
    """One program step: function name, input node indices, optional side-input value."""

    function: str
    inputs: tuple[int, ...]
    value: str | None = None

    def to_list(self) -> list:
        """The compact JSON form ``[function, [inputs], value]``."""
        return [self.function, list(self.inputs), self.value]


def module_type(node: ProgramNode) -> str:
    """IEP's module name of a node: ``function[value]`` or ``function``."""
    return f"{node.function}[{node.value}]" if node.value is not None else node.function


def _check_node(i: int, item: object, nodes: list[ProgramNode], meta: Metadata,
                bad: Callable[..., DataFormatError]) -> ProgramNode:
    """Check program node ``i`` (JSON form) against the earlier ``nodes``."""
    if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
            and isinstance(item[1], list)):
        raise bad(f"program node {i} = {shorten(str(item))}",
                  "[function, [input indices], value or null]")
    name, inputs, value = item
    spec = meta.functions.get(name)
    if spec is None or spec.template_only:
        known = [f for f, s in meta.functions.items() if not s.template_only]
        what = "template-only function" if spec else "unknown function"
        raise bad(f"program node {i}: {what} {name!r}", "a program function of metadata.json",
                  ("use one of " + ", ".join(known) + "." + did_you_mean(name, known))
                  .rstrip("."))
    if len(inputs) != len(spec.inputs):
        raise bad(f"program node {i} {name!r} with {len(inputs)} input(s) {inputs}",
                  f"arity {len(spec.inputs)} ({', '.join(spec.inputs) or 'no inputs'})")
    for k, j in enumerate(inputs):
        if not isinstance(j, int) or isinstance(j, bool) or not 0 <= j < i:
            raise bad(f"program node {i} {name!r} input {j!r}",
                      f"the index of an earlier node (0..{i - 1})")
        got = meta.functions[nodes[j].function].output
        if got != spec.inputs[k]:
            raise bad(f"program node {i} {name!r} input {k} = node {j} of type {got}",
                      f"type {spec.inputs[k]}")
    if spec.side_inputs:
        allowed = meta.types.get(spec.side_inputs[0], ())
        if value not in allowed:
            raise bad(f"program node {i} {name!r} with value {value!r}",
                      f"one of {', '.join(allowed)}")
    elif value is not None:
        raise bad(f"program node {i} {name!r} with value {value!r}",
                  "no value (null) for a function without side inputs")
    return ProgramNode(name, tuple(inputs), value)


def parse_program(raw: object, meta: Metadata, path: str | Path = "<program>",
                  line: int = 1) -> tuple[ProgramNode, ...]:
    """Check and convert a program in JSON form (a list of ``[function, inputs, value]``).

    Raises:
        DataFormatError: Naming ``file:line`` and the node for an unknown or template-only
            function, a wrong number of inputs (arity), an input that is not an earlier node
            or has the wrong type, a missing or unknown side-input value, or a last node that
            is not terminal.
    """
    def bad(found: str, expected: str, fix: str = "") -> DataFormatError:
        return DataFormatError(path, line, found, expected, fix)

    if not isinstance(raw, list) or not raw:
        raise bad(f"program {shorten(str(raw))}", "a non-empty list of nodes")
    nodes: list[ProgramNode] = []
    for i, item in enumerate(raw):
        nodes.append(_check_node(i, item, nodes, meta, bad))
    last = meta.functions[nodes[-1].function]
    if not last.terminal:
        raise bad(f"last program node {nodes[-1].function!r}",
                  "a terminal function (count, exist, query_*, equal_*, ...)")
    return tuple(nodes)


def _unique(objs: frozenset) -> int:
    if len(objs) != 1:
        raise UndefinedAnswerError(f"unique of a set of {len(objs)} objects")
    return next(iter(objs))


def _same(scene: Scene, attr: str, i: int) -> frozenset:
    ref = getattr(scene.objects[i], attr)
    return frozenset(j for j, o in enumerate(scene.objects)
                     if j != i and getattr(o, attr) == ref)


# function -> (node, input values, scene) -> value; prefixed families are handled in apply
_OPS = {
    "scene": lambda n, a, s: frozenset(range(len(s.objects))),
    "unique": lambda n, a, s: _unique(a[0]),
    "relate": lambda n, a, s: frozenset(s.relations[n.value][a[0]]),
    "union": lambda n, a, s: a[0] | a[1],
    "intersect": lambda n, a, s: a[0] & a[1],
    "count": lambda n, a, s: len(a[0]),
    "exist": lambda n, a, s: len(a[0]) > 0,
    "less_than": lambda n, a, s: a[0] < a[1],
    "greater_than": lambda n, a, s: a[0] > a[1],
}
_PREFIXED = {
    "filter_": lambda attr, n, a, s: frozenset(
        i for i in a[0] if getattr(s.objects[i], attr) == n.value),
    "same_": lambda attr, n, a, s: _same(s, attr, a[0]),
    "query_": lambda attr, n, a, s: getattr(s.objects[a[0]], attr),
    "equal_": lambda attr, n, a, s: a[0] == a[1],
}


def apply(node: ProgramNode, args: list, scene: Scene) -> object:
    """Apply one node to its input values (sets are ``frozenset`` of object indices).

    Raises:
        UndefinedAnswerError: For ``unique`` of a set whose size is not 1.
    """
    op = _OPS.get(node.function)
    if op is not None:
        return op(node, args, scene)
    prefix, _, attr = node.function.partition("_")
    fn = _PREFIXED.get(prefix + "_")
    if fn is None:
        raise UndefinedAnswerError(f"no semantics for function {node.function!r}")
    return fn(attr, node, args, scene)


def execute(program: tuple[ProgramNode, ...], scene: Scene) -> list[object]:
    """Run a (validated) program on a scene; returns every node's value, the answer last.

    Raises:
        UndefinedAnswerError: Naming the node whose ``unique`` saw a set of size != 1.
    """
    values: list[object] = []
    for i, node in enumerate(program):
        try:
            values.append(apply(node, [values[j] for j in node.inputs], scene))
        except UndefinedAnswerError as exc:
            raise UndefinedAnswerError(f"program node {i} {module_type(node)}: {exc}") from None
    return values


def answer_text(value: object) -> str:
    """The answer as text: ``yes``/``no`` for booleans, digits for counts, else the value."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | str):
        return str(value)
    raise TypeError(f"not an answer: {value!r} (the program does not end in a terminal node)")


@dataclass(frozen=True)
class Question:
    """A question on scene ``scene`` (index in the split's scene file)."""

    scene: int
    family: str
    template: int
    text: str
    program: tuple[ProgramNode, ...]
    answer: str

    def to_json(self) -> str:
        """One compact JSON line."""
        return json.dumps({"scene": self.scene, "family": self.family,
                           "template": self.template, "question": self.text,
                           "program": [n.to_list() for n in self.program],
                           "answer": self.answer}, separators=(",", ":"))


def load_questions(path: str | Path, meta: Metadata, n_scenes: int | None = None
                   ) -> list[Question]:
    """Load a question file (one JSON object per line), validating every program.

    Args:
        path: The ``*_questions.jsonl`` file.
        meta: The function table the programs are checked against.
        n_scenes: If given, every ``scene`` index must be below it.

    Raises:
        DataFormatError: Naming ``file:line`` for invalid JSON, a missing key, a scene index
            out of range, or an invalid program (see :func:`parse_program`).
    """
    out = []
    lines = read_lines(path)
    if not any(t.strip() for t in lines):
        raise DataFormatError(path, 1, "an empty file (no questions)", "one JSON question "
                              "object per line", "check the path and the file")
    for i, text in enumerate(lines):
        line = i + 1
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataFormatError(path, line, f"invalid JSON ({exc.msg} at column "
                                  f"{exc.colno})", "one JSON object per line") from None
        keys = ("scene", "family", "template", "question", "program", "answer")
        missing = [k for k in keys if not isinstance(data, dict) or k not in data]
        if missing:
            raise DataFormatError(path, line, f"a question without {', '.join(missing)}",
                                  f"the keys {', '.join(keys)}")
        scene = data["scene"]
        if not isinstance(scene, int) or scene < 0 or (n_scenes is not None
                                                        and scene >= n_scenes):
            raise DataFormatError(path, line, f"scene index {scene!r}",
                                  f"an index 0..{(n_scenes or 1) - 1} of the scene file")
        if isinstance(data["template"], bool) or not isinstance(data["template"], int):
            raise DataFormatError(path, line, f"template {data['template']!r}",
                                  "a template index (an integer)")
        program = parse_program(data["program"], meta, path, line)
        out.append(Question(scene, str(data["family"]), int(data["template"]),
                            str(data["question"]), program, str(data["answer"])))
    return out


def dump_questions(questions: list[Question], path: str | Path) -> None:
    """Write questions one per line (the format :func:`load_questions` reads)."""
    Path(path).write_text("".join(q.to_json() + "\n" for q in questions), encoding="utf-8")

