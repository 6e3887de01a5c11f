"""The project's import graph has no cycles (issue 16 item 9; layering in docs/errors.md).

Edges are read with the standard library's :mod:`ast` from every module of ``edbatch/``,
``envs/``, ``policies/`` and ``experiments/``. Every ``import`` counts: module level,
inside functions, and under ``if TYPE_CHECKING:`` (a type-only circle is still a circle
for a reader and for tools). ``from pkg import name`` is an edge to ``pkg.name`` when that
is a module of the project, else to ``pkg``. The implicit import of a parent package's
``__init__`` is not counted (every submodule would otherwise depend on its package).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("edbatch", "envs", "policies", "experiments")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(module: str, level: int, current: str, is_pkg: bool) -> str:
    if not level:
        return module
    base = current.split(".")
    base = base if is_pkg else base[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def import_graph() -> dict[str, set[str]]:
    """Module -> project modules it imports (see the module doc for what counts)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node.module or "", node.level, name, is_pkg)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            for t in targets:
                while t and t not in mods:  # `import a.b.c` of a non-module tail
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first repeated at the end), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return [*stack[stack.index(n):], n]
            if n not in state and (found := visit(n)) is not None:
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def test_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 50 and "edbatch.executor.torch_executor" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(("a", "b"), [
    ("edbatch.executor.torch_executor", "edbatch.executor._analytic"),
    ("edbatch.executor.torch_executor", "edbatch.executor._train"),
    ("edbatch.workloads._trees", "edbatch.workloads._tree_arrays"),
])
def test_the_two_known_circles_go_one_way(a: str, b: str) -> None:
    graph = import_graph()
    assert b in graph[a] and a not in graph[b]


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


LAYERS = {"edbatch": 0, "envs": 1, "policies": 2, "experiments": 3}


def test_layers_import_downwards_only() -> None:
    """edbatch (library) <- envs <- policies <- experiments: no package imports a later one."""
    upward = [f"{m} -> {d}" for m, deps in import_graph().items() for d in deps
              if LAYERS[d.split(".")[0]] > LAYERS[m.split(".")[0]]]
    assert not upward, "imports against the layering: " + "; ".join(sorted(upward))
