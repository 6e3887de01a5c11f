"""A run folder bound to the configuration that made it (``experiments.train`` and
``experiments.train_model``).

The first run writes ``run_config.json``: the resolved config minus what does not change
the result (paths, progress bars, the logger, ``resume``). A rerun into the same folder
compares its own; equal: it resumes from the checkpoint. Different: it stops before touching
anything, naming the keys that differ and the fix (another ``run_dir``, or ``resume=restart``,
which moves the old run's files into ``replaced/<time>/`` and starts over).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from edbatch.errors import RunDirError

__all__ = ["BINDING_FILE", "bind_run_dir", "binding", "differences"]

BINDING_FILE = "run_config.json"
#: Top-level keys that do not change what is trained.
UNBOUND = ("progress", "logger", "run_dir", "artifact", "checkpoint", "learning_curve",
           "resume")


def binding(cfg: DictConfig, unbound: tuple[str, ...] = UNBOUND) -> dict[str, Any]:
    """The resolved config keys a run folder is bound to (all top-level keys but
    ``unbound``)."""
    keys = [str(k) for k in cfg.keys() if k not in unbound]  # paths may need Hydra's runtime
    out = {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k])
           else cfg[k] for k in keys}
    return json.loads(json.dumps(out, default=str))


_ABSENT = "(absent)"


def _show(value: Any) -> str:
    return f"<{len(value)} keys>" if isinstance(value, dict) and value else repr(value)


def differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """``key: old -> new`` for every nested key whose value differs; a section present on
    one side only (another workload) is one entry, ``<N keys>``."""
    out: list[str] = []
    for k in sorted(old.keys() | new.keys()):
        a, b = old.get(k, _ABSENT), new.get(k, _ABSENT)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {_show(a)} -> {_show(b)}")
    return out


def bind_run_dir(cfg: DictConfig, run_dir: str | Path, files: list[str | Path],
                 resume: str = "auto", *, unbound: tuple[str, ...] = UNBOUND,
                 write: bool = True) -> str:
    """Check (or write) ``run_dir``'s binding; return ``"new"``, ``"resume"`` or
    ``"restart"``. ``files`` are the run's outputs (artifact, checkpoint, curve).

    ``unbound``: the top-level keys left out of the binding (paths, logging). ``write=False``
    only checks (raises as below, moves and writes nothing): the data-parallel ranks other
    than rank 0, which alone writes.

    Raises:
        RunDirError: the folder holds a run made with another configuration (or one without
            a binding file) and ``resume`` is not ``"restart"``.
    """
    run_dir = Path(run_dir)
    paths = [Path(f) for f in files]
    mine = binding(cfg, unbound)
    bound = run_dir / BINDING_FILE
    outputs = [f for f in paths if f.exists()]
    existing = [f for f in [bound, *outputs] if f.exists()]
    state = "new"
    if outputs:  # a binding file alone (a run that failed before saving) guards nothing
        if bound.exists():
            try:
                theirs = json.loads(bound.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                theirs, diff = None, [f"{bound} is not JSON ({e})"]
            else:
                diff = differences(theirs, mine) if isinstance(theirs, dict) else \
                    [f"{bound} holds a JSON {type(theirs).__name__}, not a config object"]
        else:
            diff = [f"{run_dir} holds {', '.join(f.name for f in existing)} without "
                    f"{BINDING_FILE} (made before run folders were bound to their config)"]
        if not diff:
            state = "resume"
        elif resume != "restart":
            shown = "; ".join(diff[:6]) + (f"; and {len(diff) - 6} more" if len(diff) > 6
                                           else "")
            raise RunDirError(
                f"run folder {run_dir} holds a run made with another configuration "
                f"({shown}). Nothing was changed. Fix: pass run_dir=<a new folder>, or "
                f"resume=restart to start this folder over (the old run moves to "
                f"{run_dir}/replaced/)")
        else:
            if write:
                dest = run_dir / "replaced" / \
                    f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{os.getpid()}"
                dest.mkdir(parents=True)
                for f in existing:
                    shutil.move(str(f), dest / f.name)
            state = "restart"
    if state != "resume" and write:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = bound.with_name(f".{bound.name}.tmp")
        tmp.write_text(json.dumps(mine, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, bound)
    return state
