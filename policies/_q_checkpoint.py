"""Checkpoints of the tabular Q-learner and the Ctrl-C holder that keeps them whole.

Split from :mod:`policies.q_learning`: a checkpoint is a JSON file with the config (the
learner's dataclass, ``cfg``), the Q-table, the best snapshot, the episode counter, epsilon
and the generator state, written atomically (temporary file, then rename);
:class:`HeldCtrlC` keeps an interrupt out of a table update or a checkpoint write.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from edbatch.errors import PolicyFileError
from envs.encoding import StateKey

__all__ = ["HeldCtrlC", "QTable", "load_checkpoint", "save_checkpoint"]

QTable = dict[StateKey, dict[int, float]]


class HeldCtrlC:
    """Holds Ctrl-C (SIGINT, main thread only) from its creation to :meth:`close`, except
    inside :meth:`released` blocks, where it raises at once as usual; one that came while
    held raises on entering the next such block. So an interrupt never lands in the middle
    of a table update or a checkpoint write."""

    def __init__(self) -> None:
        self.caught = False
        self.old: Any = None
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is not None):
            self.old = signal.signal(signal.SIGINT, self._hold)

    def _hold(self, signum: int, frame: Any) -> None:
        self.caught = True

    @contextmanager
    def released(self) -> Iterator[None]:
        if self.old is None:
            yield
            return
        if self.caught:
            raise KeyboardInterrupt
        signal.signal(signal.SIGINT, self.old)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, self._hold)

    def close(self) -> bool:
        """Restore the previous handler; whether a Ctrl-C came while held."""
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
            self.old = None
        return self.caught


def save_checkpoint(path: str | Path | None, cfg: Any, q: QTable,
                     best_q: QTable, best_ratio: float, episode: int, eps: float,
                     seconds: float, rng: np.random.Generator) -> None:
    if path is None:  # no checkpoint file asked for
        return
    def table(t: QTable) -> list[Any]:
        return [[list(s), [[a, v] for a, v in qs.items()]] for s, qs in t.items()]

    data = {"config": asdict(cfg), "episode": episode, "epsilon": eps, "seconds": seconds,
            "best_ratio": best_ratio, "rng": rng.bit_generator.state, "q": table(q),
            "best_q": table(best_q)}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def load_checkpoint(path: str | Path, cfg: Any, rng: np.random.Generator
                     ) -> tuple[QTable, QTable, float, int, float, float]:
    try:
        data = json.loads(Path(path).read_text())

        def table(rows: list[Any]) -> QTable:
            return {tuple(s): {int(a): float(v) for a, v in qs} for s, qs in rows}

        if data["config"] != json.loads(json.dumps(asdict(cfg))):
            raise PolicyFileError(path, "checkpoint was written with another configuration",
                                  "delete it or use another checkpoint path")
        rng.bit_generator.state = data["rng"]
        return (table(data["q"]), table(data["best_q"]), float(data["best_ratio"]),
                int(data["episode"]), float(data["epsilon"]), float(data["seconds"]))
    except PolicyFileError:
        raise
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise PolicyFileError(path, f"corrupt checkpoint ({type(e).__name__}: {e})",
                              "delete it to start training afresh") from None
