"""IEP's execution engine (Johnson et al., 2017) over CLEVR programs on scene graphs.

Each question of ``data/clevr/`` (see :mod:`edbatch.data.clevr_templates`) is a functional
program run by a tree of neural *modules*, one module type per program function and side
value as in IEP (``filter_color[red]``, ``relate[left]``, ``count``): **41 module types**
(:meth:`~edbatch.data.clevr_programs.Metadata.module_types`; 40 occur in the stored split,
``equal_object`` in none), so one mini-batch mixes dozens of op types.

**No images.** CLEVR's images are not here: the modules act on the *per-object features of
the scene graph*, not on CNN features. An object is the row ``f = [1, o, e, x, y]`` with
``o`` the one-hot size (2), colour (8), material (2) and shape (3), and
``e = E[size] + E[colour] + E[material] + E[shape]`` (a learned table ``module_net.object.E``
of 15 rows, one per attribute value, ``D = embed_dim`` wide; ``F = D + 18``; the leading 1
marks a real object, ``x, y`` in ``[-3, 3]``); a scene is its ``N = 10`` rows (zero rows
after the last object).
With ``H = hidden_dim``, ``sig`` the sigmoid, ``att`` an attention over the ``N`` objects:

* ``object`` (no operands, attr = :func:`pack_object`) gives ``f``; ``objects`` (variadic
  over the scene's object nodes, attr = their number) stacks them into ``(N * F,)``.
* ``scene``: ``att = mask`` (column 0). ``filter_a[v]``: ``att' = att * sig(f w + b)``.
* ``relate[r]``: ``att'_j = mask_j sum_{i != j} att_i sig(u . (f_j - f_i) + c)``;
  ``same_a``: the same with the score ``f_i^T M f_j + c`` (the other objects sharing ``a``).
* ``unique``: ``att / (sum att + 1e-3)``; ``union``: ``a + b - a b``; ``intersect``: ``a b``.
* ``count`` / ``exist``: ``tanh(W k(s) + b)`` with ``s = sum att`` and ``k_m(s) =
  exp(-2 (s - m)^2)``, ``m = 0..10``. ``query_a``: ``tanh(W (sum_j att_j f_j) + b)``.
* ``equal_a``, ``equal_integer``, ``less_than``, ``greater_than`` (two ``(H,)`` operands):
  ``tanh(W [x; y; x * y] + b)``; ``equal_object``: ``tanh(W (sum_j a_j b_j) + b)``.
* ``answer`` (the terminal's vector, attr = the answer's index in :meth:`ModuleNet.answers`):
  cross-entropy of ``W h + b`` over the 28 answers (yes, no, 0-10 and attribute values).

Every module type has its own parameters (``module_net.<type>.W`` ...; brackets become
dots). Granularity: ``"cell"`` only (one node per program step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edbatch.data.clevr_programs import Metadata, Question, load_metadata, module_type
from edbatch.data.clevr_scenes import ATTRIBUTES, Properties, Scene, load_properties
from edbatch.data.clevr_templates import load_clevr
from edbatch.errors import GraphError, is_integer
from edbatch.graph import GraphBuilder, OpType
from edbatch.workloads._seq import check_positive
from edbatch.workloads.base import Workload
from edbatch.workloads.primitives import OpSet

__all__ = ["ATTRIBUTE_ROWS", "COUNT_BINS", "MAX_OBJECTS", "VOCAB_SIZES", "ModuleNet",
           "QuestionInstance", "XY_OFFSET", "XY_RADIX", "pack_object", "unpack_object"]

#: Objects per scene at most (CLEVR samples 3 to 10); shorter scenes are padded.
MAX_OBJECTS = 10
#: Values of size, colour, material and shape (CLEVR's ``properties.json``, ATTRIBUTES order).
VOCAB_SIZES: tuple[int, ...] = (2, 8, 2, 3)
#: Rows of the attribute embedding table (one per attribute value).
ATTRIBUTE_ROWS = sum(VOCAB_SIZES)
#: Count bins of ``count`` / ``exist`` (0..10).
COUNT_BINS = MAX_OBJECTS + 1
#: A coordinate in hundredths, offset: ``round(100 x) + XY_OFFSET`` in ``0..XY_RADIX-1``.
XY_OFFSET, XY_RADIX = 300, 601
_PREFIX = "module_net"


def pack_object(indices: Sequence[int], x: float, y: float) -> int:
    """One object as an int: attribute value indices (ATTRIBUTES order), then ``x``, ``y``.

    Raises:
        GraphError: a value index or a coordinate (``[-3, 3]``, hundredths) is out of range.
    """
    code, radix = 0, 1
    xq, yq = round(x * 100) + XY_OFFSET, round(y * 100) + XY_OFFSET
    for value, size in zip((*indices, xq, yq), (*VOCAB_SIZES, XY_RADIX, XY_RADIX),
                           strict=True):
        if not is_integer(value) or not 0 <= value < size:
            raise GraphError(f"object field value {value!r} outside 0..{size - 1} (attribute "
                             f"indices {list(indices)}, x={x}, y={y}); coordinates must lie "
                             f"in [-3, 3]")
        code += value * radix
        radix *= size
    return code


def unpack_object(code: int) -> tuple[list[int], float, float]:
    """Inverse of :func:`pack_object`: ``(attribute indices, x, y)``."""
    out = []
    for size in (*VOCAB_SIZES, XY_RADIX, XY_RADIX):
        out.append(code % size)
        code //= size
    return out[:4], (out[4] - XY_OFFSET) / 100, (out[5] - XY_OFFSET) / 100


def _param_key(mtype: str) -> str:
    return f"{_PREFIX}.{mtype.replace('[', '.').rstrip(']')}"


@dataclass(frozen=True, slots=True, eq=False)
class QuestionInstance:
    """A question pre-encoded for emission.

    Attributes:
        split: the split it was loaded from.
        index: its position in that split.
        question: the question (program, answer, family).
        object_codes: :func:`pack_object` of each object of its scene.
        answer: index of the answer in :meth:`ModuleNet.answers`.
    """

    split: str
    index: int
    question: Question
    object_codes: tuple[int, ...]
    answer: int


class ModuleNet(Workload):
    """IEP-style module network over CLEVR programs (see the module docstring).

    Example:
        >>> w = ModuleNet(hidden_dim=8)
        >>> g = w.minibatch("val", range(2))
        >>> g.vocab[int(g.op_ids[0])].name, g.vocab[int(g.op_ids[-1])].name
        ('module_net.object', 'loss_sum')
    """

    name = "module_net"
    default_eval_split = "val"
    default_val_split = "val"
    real_data = True
    granularities = ("cell",)
    hand_backward = True

    @classmethod
    def test_kwargs(cls, dim: int = 8, hidden: int | None = None, *, short: bool = False
                    ) -> dict[str, Any]:
        """Small object embeddings (``dim``) and module outputs (``hidden``, else ``dim``)."""
        return {"embed_dim": dim, "hidden_dim": dim if hidden is None else hidden}

    def __init__(self, granularity: str = "cell", embed_dim: int = 16, hidden_dim: int = 64,
                 data_dir: str | Path | None = None) -> None:
        """Declare the op vocabulary (one op type per module type).

        Args:
            granularity: ``"cell"`` (the only one).
            embed_dim: width ``D`` of the attribute embeddings of an object row.
            hidden_dim: width ``H`` of the vectors of terminal modules.
            data_dir: folder holding ``clevr/``; defaults to ``data/``.
        """
        super().__init__(granularity, data_dir)
        if granularity != "cell":
            raise GraphError(f"module_net has only the 'cell' granularity, got "
                             f"{granularity!r}; use granularity='cell'")
        check_positive(embed_dim=embed_dim, hidden_dim=hidden_dim)
        self.embed_dim, self.hidden_dim = embed_dim, hidden_dim
        folder = self.data_dir / "clevr"
        self.meta: Metadata = load_metadata(folder / "metadata.json")
        self.props: Properties = load_properties(folder / "properties.json")
        sizes = tuple(len(self.props.values[a]) for a in ATTRIBUTES)
        if sizes != VOCAB_SIZES:
            raise GraphError(f"{folder / 'properties.json'}: attribute vocabularies of sizes "
                             f"{sizes}, expected CLEVR's {VOCAB_SIZES} (ATTRIBUTES order)")
        self._answers = ("no", "yes", *(str(k) for k in range(COUNT_BINS)),
                         *(v for a in ATTRIBUTES for v in self.props.values[a]))
        self._answer_index = {a: k for k, a in enumerate(self._answers)}
        self._scenes: dict[str, list[Scene]] = {}
        self._declare_vocab()
        #: op type name -> its operand count (a module reading features has one more)
        self._arity = {op.name: len(op.in_shapes or ()) for op in self.vocab}

    @property
    def answers(self) -> tuple[str, ...]:
        """The answer vocabulary (classifier outputs, in order)."""
        return self._answers

    # ------------------------------------------------------------------ vocabulary
    def _op(self, ops: OpSet, mtype: str, kind: str, in_shapes: tuple, out: int,
            params: dict[str, tuple[int, ...]]) -> None:
        key = _param_key(mtype)
        named = {f"{key}.{n}": s for n, s in params.items()}
        ops.add(OpType(f"{_PREFIX}.{mtype}", f"{_PREFIX}.{kind}", in_shapes, (out,),
                       tuple(named)), named)

    def _declare_cells(self, ops: OpSet) -> None:
        n, f, h = MAX_OBJECTS, self.embed_dim + 3 + ATTRIBUTE_ROWS, self.hidden_dim
        att, scene, vec = (n,), (n * f,), (h,)
        self._op(ops, "object", "object", (), f, {"E": (ATTRIBUTE_ROWS, self.embed_dim)})
        ops.add(OpType(f"{_PREFIX}.objects", f"{_PREFIX}.objects", None, (n * f,)))
        for mtype in self.meta.module_types():
            fn = mtype.split("[")[0]
            if fn == "scene":
                self._op(ops, mtype, "start", (scene,), n, {})
            elif fn.startswith("filter_"):
                self._op(ops, mtype, "filter", (att, scene), n, {"w": (f,), "b": (1,)})
            elif fn == "relate":
                self._op(ops, mtype, "relate", (att, scene), n, {"u": (f,), "c": (1,)})
            elif fn.startswith("same_"):
                self._op(ops, mtype, "same", (att, scene), n, {"M": (f, f), "c": (1,)})
            elif fn in ("unique", "union", "intersect"):
                self._op(ops, mtype, fn, (att,) * (1 if fn == "unique" else 2), n, {})
            elif fn in ("count", "exist"):
                self._op(ops, mtype, "count", (att,), h, {"W": (h, COUNT_BINS), "b": (h,)})
            elif fn.startswith("query_"):
                self._op(ops, mtype, "query", (att, scene), h, {"W": (h, f), "b": (h,)})
            elif fn == "equal_object":
                self._op(ops, mtype, "equal_object", (att, att), h, {"W": (h, 1), "b": (h,)})
            elif fn.startswith("equal_") or fn in ("less_than", "greater_than"):
                self._op(ops, mtype, "compare", (vec, vec), h, {"W": (h, 3 * h), "b": (h,)})
            else:
                raise GraphError(f"metadata.json function {fn!r} has no module in "
                                 f"edbatch/workloads/module_net.py")
        self._op(ops, "answer", "answer", (vec,), 1,
                 {"W": (len(self._answers), h), "b": (len(self._answers),)})

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape."""
        return dict(self._params)

    # ------------------------------------------------------------------ data
    @property
    def splits(self) -> tuple[str, ...]:
        """``("train", "val", "test")`` of ``data/clevr``."""
        return ("train", "val", "test")

    def _load(self, split: str) -> Sequence[QuestionInstance]:
        scenes, questions = load_clevr(self.data_dir / "clevr", split)
        self._scenes[split] = scenes
        return [self.encode(q, scenes[q.scene], split, k) for k, q in enumerate(questions)]

    def encode(self, question: Question, scene: Scene, split: str = "<question>",
               index: int = 0) -> QuestionInstance:
        """Pre-encode one question on its scene.

        Raises:
            GraphError: naming the question for a scene of more than :data:`MAX_OBJECTS`
                objects, an answer outside :meth:`answers` or a function without a module.
        """
        where = f"question #{index} of split {split!r} ({question.text!r})"
        if not 1 <= len(scene.objects) <= MAX_OBJECTS:
            raise GraphError(f"{where}: its scene has {len(scene.objects)} objects; the "
                             f"module network takes 1..{MAX_OBJECTS}")
        if question.answer not in self._answer_index:
            raise GraphError(f"{where}: answer {question.answer!r} is not one of "
                             f"{list(self._answers)}")
        for node in question.program:
            if f"{_PREFIX}.{module_type(node)}" not in self._arity:
                raise GraphError(f"{where}: module {module_type(node)!r} is not declared; "
                                 f"known: {self.meta.module_types()}")
        codes = tuple(pack_object([self.props.values[a].index(getattr(o, a))
                                   for a in ATTRIBUTES], o.x, o.y) for o in scene.objects)
        return QuestionInstance(split, index, question, codes,
                                self._answer_index[question.answer])

    # ------------------------------------------------------------------ emission
    def emit_terminal(self, inst: QuestionInstance, b: GraphBuilder) -> int:
        """Append a question's object, scene and module nodes; return the terminal node."""
        add = b.add
        objs = [add(f"{_PREFIX}.object", attr=code) for code in inst.object_codes]
        scene = add(f"{_PREFIX}.objects", *objs, attr=len(objs))
        done: list[int] = []
        for node in inst.question.program:
            name = f"{_PREFIX}.{module_type(node)}"
            args = [done[j] for j in node.inputs]
            if self._arity[name] > len(args):
                args.append(scene)  # modules reading the objects' features
            done.append(add(name, *args))
        return done[-1]

    def emit(self, instance: QuestionInstance, builder: GraphBuilder) -> list[int]:
        """Append one question's nodes; return its loss node id."""
        h = self.emit_terminal(instance, builder)
        return [builder.add(f"{_PREFIX}.answer", h, attr=instance.answer)]
