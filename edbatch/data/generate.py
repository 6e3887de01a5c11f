"""Regenerate the derived data files in ``data/`` bit for bit.

* ``python -m edbatch.data.generate esol-split``: ``data/esol/split.json`` (random 80/10/10,
  ``numpy.random.default_rng(seed)``, seed 0).
* ``python -m edbatch.data.generate clevr``: ``data/clevr/{train,val,test}_{scenes,
  questions}.jsonl`` (seed 0, 4000/500/500 questions, 10 per scene).

Kept apart from the loaders so that ``python -m`` does not re-import a module the package
``edbatch.data`` already imported.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edbatch.data.clevr_templates import SPLITS, write_splits
from edbatch.data.molecules import load_esol, make_esol_split

__all__ = ["main", "write_esol_split"]

DATA = Path(__file__).resolve().parents[2] / "data"


def write_esol_split(csv_path: str | Path, out: str | Path, seed: int = 0) -> None:
    """Write the split of ``csv_path``'s molecules to ``out`` (compact, one part per line)."""
    split = make_esol_split(len(load_esol(csv_path)), seed)
    lines = [f'"seed": {seed}', '"method": "random 80/10/10, numpy default_rng(seed)"']
    lines += [f'"{k}": {json.dumps(v, separators=(",", ":"))}' for k, v in split.items()]
    Path(out).write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description="Regenerate derived data files.")
    sub = parser.add_subparsers(dest="what", required=True)
    esol = sub.add_parser("esol-split", help="data/esol/split.json")
    esol.add_argument("--csv", default=str(DATA / "esol" / "delaney-processed.csv"))
    esol.add_argument("--out", default=str(DATA / "esol" / "split.json"))
    esol.add_argument("--seed", type=int, default=0)
    clevr = sub.add_parser("clevr", help="the CLEVR scene and question files")
    clevr.add_argument("--data", default=str(DATA / "clevr"),
                       help="folder with CLEVR's JSON files")
    clevr.add_argument("--out", default=str(DATA / "clevr"), help="where the split files go")
    clevr.add_argument("--seed", type=int, default=0)
    clevr.add_argument("--per-scene", type=int, default=10)
    for split, n in SPLITS.items():
        clevr.add_argument(f"--{split}", type=int, default=n, help=f"{split} questions")
    args = parser.parse_args(argv)
    if args.what == "esol-split":
        write_esol_split(args.csv, args.out, args.seed)
        print(f"wrote {args.out}")
        return
    sizes = {s: getattr(args, s) for s in SPLITS}
    write_splits(args.data, args.out, args.seed, sizes, args.per_scene)
    print(f"wrote {', '.join(f'{s}: {n}' for s, n in sizes.items())} questions to {args.out}")


if __name__ == "__main__":  # pragma: no cover
    main()
