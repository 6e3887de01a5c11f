"""CLEVR scene graphs: objects with shape, colour, material, size and a 2-D position.

There are no CLEVR images here: a scene is only its graph, as CLEVR's renderer records it
(``data/clevr/properties.json`` lists the attribute values). Scenes are sampled the way CLEVR
places its objects, in our own code:

* 3 to 10 objects (uniform), each with a uniform shape, colour, material and size;
* a position uniform in ``[-3, 3]^2`` on the ground plane, radius = the size's value in
  ``properties.json`` (large 0.7, small 0.35);
* an object is re-drawn if it comes closer than ``min_dist`` (0.25) to another one (gap between
  the two discs) or if the two differ by less than ``margin`` (0.4) along either axis, so that
  every left/right and front/behind relation is clear; after 50 failed draws the whole scene
  is started again (CLEVR does the same).

Relations come from positions, with the camera looking along +y: ``b`` is *right* of ``a`` if
``b.x > a.x``, *left* if ``b.x < a.x``, *behind* if ``b.y > a.y`` and in *front* if
``b.y < a.y``. Positions are rounded to 2 decimals before relations are computed, so stored
scenes reproduce them exactly.

A scene file holds one JSON object per line: ``{"objects": [{"shape", "color", "material",
"size", "x", "y"}, ...]}``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edbatch.data._text import read_json, read_lines, shorten
from edbatch.errors import DataFormatError

__all__ = [
    "ATTRIBUTES",
    "RELATIONS",
    "ClevrObject",
    "Properties",
    "Scene",
    "dump_scenes",
    "load_properties",
    "load_scenes",
    "parse_scene",
    "sample_scene",
    "scene_features",
]

#: Object attributes, in the order CLEVR's templates list them (<Z> <C> <M> <S>).
ATTRIBUTES: tuple[str, ...] = ("size", "color", "material", "shape")
#: Spatial relations (CLEVR's metadata.json order).
RELATIONS: tuple[str, ...] = ("left", "right", "behind", "front")


@dataclass(frozen=True)
class Properties:
    """Attribute vocabularies from CLEVR's ``properties.json``.

    Attributes:
        values: ``attribute -> tuple of values`` for every name in :data:`ATTRIBUTES`.
        radius: ``size value -> radius`` on the ground plane.
    """

    values: dict[str, tuple[str, ...]]
    radius: dict[str, float]


def load_properties(path: str | Path) -> Properties:
    """Read CLEVR's ``properties.json`` (keys ``shapes``, ``colors``, ``materials``, ``sizes``).

    Raises:
        DataFormatError: If a key is missing.
    """
    data = read_json(path, "CLEVR's properties.json (an object with 'shapes', 'colors', "
                           "'materials' and 'sizes')")
    values = {}
    for attr in ATTRIBUTES:
        key = attr + "s" if attr != "material" else "materials"
        if not isinstance(data, dict) or not isinstance(data.get(key), dict) or not data[key]:
            found = f"keys {sorted(data)}" if isinstance(data, dict) else \
                f"a JSON {type(data).__name__}"
            raise DataFormatError(path, 1, found, f"a non-empty object {key!r}",
                                  "use image_generation/data/properties.json of CLEVR")
        values[attr] = tuple(data[key])
    radius = {k: float(v) for k, v in data["sizes"].items()}
    return Properties(values, radius)


@dataclass(frozen=True, slots=True)
class ClevrObject:
    """One object of a scene (attribute values are strings of the vocabularies)."""

    shape: str
    color: str
    material: str
    size: str
    x: float
    y: float


@dataclass(frozen=True)
class Scene:
    """A scene graph: objects plus, per relation, the objects standing in it to each object.

    Attributes:
        objects: The objects, in index order.
        relations: ``relations[r][i]`` = sorted indices ``j != i`` such that object ``j`` is
            ``r`` of object ``i`` (e.g. ``relations["left"][0]`` = objects left of object 0).
    """

    objects: tuple[ClevrObject, ...]
    relations: dict[str, tuple[tuple[int, ...], ...]]

    @classmethod
    def from_objects(cls, objects: tuple[ClevrObject, ...]) -> Scene:
        """Build a scene and compute its relations from the positions."""
        tests = {
            "left": lambda a, b: b.x < a.x,
            "right": lambda a, b: b.x > a.x,
            "behind": lambda a, b: b.y > a.y,
            "front": lambda a, b: b.y < a.y,
        }
        relations = {
            r: tuple(tuple(j for j, b in enumerate(objects) if j != i and test(a, b))
                     for i, a in enumerate(objects))
            for r, test in tests.items()
        }
        return cls(tuple(objects), relations)

    def to_json(self) -> str:
        """One compact JSON line (relations are not stored: they follow from positions)."""
        objs = [{"shape": o.shape, "color": o.color, "material": o.material, "size": o.size,
                 "x": o.x, "y": o.y} for o in self.objects]
        return json.dumps({"objects": objs}, separators=(",", ":"))


def sample_scene(rng: random.Random, props: Properties, min_objects: int = 3,
                 max_objects: int = 10, min_dist: float = 0.25, margin: float = 0.4,
                 max_retries: int = 50) -> Scene:
    """Sample one scene as CLEVR does (see the module docstring).

    Args:
        rng: The random source (all draws come from it, in a fixed order).
        props: Attribute vocabularies and radii.
        min_objects: Fewest objects.
        max_objects: Most objects.
        min_dist: Smallest gap between two objects' discs.
        margin: Smallest difference of two objects' coordinates along each axis.
        max_retries: Failed draws of one object before the scene is restarted.
    """
    n = rng.randint(min_objects, max_objects)
    while True:
        objects: list[ClevrObject] = []
        while len(objects) < n:
            attrs = {a: rng.choice(props.values[a]) for a in ATTRIBUTES}
            r = props.radius[attrs["size"]]
            for _ in range(max_retries):
                x, y = round(rng.uniform(-3, 3), 2), round(rng.uniform(-3, 3), 2)
                if all(((x - o.x) ** 2 + (y - o.y) ** 2) ** 0.5 - r - props.radius[o.size]
                       >= min_dist and abs(x - o.x) >= margin and abs(y - o.y) >= margin
                       for o in objects):
                    objects.append(ClevrObject(attrs["shape"], attrs["color"],
                                               attrs["material"], attrs["size"], x, y))
                    break
            else:
                break
        if len(objects) == n:
            return Scene.from_objects(tuple(objects))


def scene_features(scene: Scene, props: Properties) -> np.ndarray:
    """Per-object feature rows: one-hot size, colour, material, shape, then ``x/3, y/3``.

    Returns:
        ``float32`` array ``(n_objects, 2 + sum of vocabulary sizes)`` (17 for CLEVR).
    """
    offsets, width = {}, 0
    for attr in ATTRIBUTES:
        offsets[attr] = width
        width += len(props.values[attr])
    out = np.zeros((len(scene.objects), width + 2), dtype=np.float32)
    for i, obj in enumerate(scene.objects):
        for attr in ATTRIBUTES:
            out[i, offsets[attr] + props.values[attr].index(getattr(obj, attr))] = 1.0
        out[i, width:] = (obj.x / 3.0, obj.y / 3.0)
    return out


def parse_scene(text: str, props: Properties, path: str | Path = "<scene>",
                line: int = 1) -> Scene:
    """Parse one scene line, checking every object's attributes against ``props``.

    Raises:
        DataFormatError: Naming ``file:line`` and the object for invalid JSON, a missing
            attribute or position, or a value outside the vocabulary.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, line, f"invalid JSON ({exc.msg} at column {exc.colno})",
                              "one JSON object per line") from None
    objs = data.get("objects") if isinstance(data, dict) else None
    if not isinstance(objs, list) or not objs:
        raise DataFormatError(path, line, f"{shorten(text)}",
                              'an object {"objects": [...]} with at least one object')
    objects = []
    for k, obj in enumerate(objs):
        if not isinstance(obj, dict):
            raise DataFormatError(path, line, f"object {k} = {shorten(str(obj))}",
                                  "a JSON object per scene object")
        for attr in (*ATTRIBUTES, "x", "y"):
            if attr not in obj:
                raise DataFormatError(path, line, f"object {k} without attribute {attr!r}",
                                      f"the keys {', '.join((*ATTRIBUTES, 'x', 'y'))}",
                                      f"add {attr!r} to object {k}")
        for attr in ATTRIBUTES:
            if obj[attr] not in props.values[attr]:
                raise DataFormatError(path, line, f"object {k} {attr} {obj[attr]!r}",
                                      f"one of {', '.join(props.values[attr])}")
        for attr in ("x", "y"):
            if not isinstance(obj[attr], int | float) or isinstance(obj[attr], bool):
                raise DataFormatError(path, line, f"object {k} {attr} {obj[attr]!r}",
                                      "a number")
        objects.append(ClevrObject(obj["shape"], obj["color"], obj["material"], obj["size"],
                                   float(obj["x"]), float(obj["y"])))
    return Scene.from_objects(tuple(objects))


def load_scenes(path: str | Path, props: Properties) -> list[Scene]:
    """Load a scene file (one scene per line; see :func:`parse_scene`).

    Raises:
        DataFormatError: An empty file, or a bad line (:func:`parse_scene`).
    """
    lines = read_lines(path)
    if not any(t.strip() for t in lines):
        raise DataFormatError(path, 1, "an empty file (no scenes)", "one JSON scene object "
                              "per line", "check the path and the file")
    return [parse_scene(text, props, path, i + 1) for i, text in enumerate(lines)]


def dump_scenes(scenes: list[Scene], path: str | Path) -> None:
    """Write scenes one per line (the format :func:`load_scenes` reads)."""
    Path(path).write_text("".join(s.to_json() + "\n" for s in scenes), encoding="utf-8")
