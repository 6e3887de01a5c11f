"""What every entry point does around its work: validate the config, turn user errors and
Ctrl-C into one or two lines on stderr and a non-zero exit (no traceback), and keep Hydra's
``.hydra/`` of an earlier run in the same folder.

``HYDRA_FULL_ERROR=1`` re-raises, so developers still get the whole traceback.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from edbatch.errors import EdbatchError
from experiments._schema import validate

__all__ = ["EXIT_INTERRUPTED", "EXIT_USER_ERROR", "guarded", "hydra_output_subdir"]

T = TypeVar("T")
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
#: User errors: edbatch's own, and Hydra / OmegaConf config errors raised while the job runs
#: (a bad value inside a config group reaching its constructor, a missing interpolation).
USER_ERRORS = (EdbatchError, HydraException, OmegaConfBaseException, FileNotFoundError)


def _say(kind: str, text: str) -> None:
    print(f"{kind}: {text}", file=sys.stderr, flush=True)


def guarded(task: Callable[[DictConfig], T]) -> Callable[[DictConfig], T]:
    """Wrap a Hydra task function: validate ``cfg``, print user errors in one line each."""

    @functools.wraps(task)
    def wrapper(cfg: DictConfig) -> T:
        full = os.environ.get("HYDRA_FULL_ERROR") == "1"
        try:
            validate(cfg)
            return task(cfg)
        except KeyboardInterrupt as e:
            if full:
                raise
            _say("interrupted", str(e) or "stopped by Ctrl-C (nothing to save)")
            sys.exit(EXIT_INTERRUPTED)
        except USER_ERRORS as e:
            if full:
                raise
            msg = str(e).strip() or type(e).__name__
            if type(e) is FileNotFoundError and e.filename:  # the OS's own "[Errno 2] ..."
                msg = (f"{e.filename}: no such file or directory. Fix: check the path on the "
                       "command line or in the config (a workload's data_dir, a folder option)")
            cause = e.__cause__
            if isinstance(e, HydraException) and cause is not None and str(cause) not in msg:
                msg += f" ({type(cause).__name__}: {cause})"
            _say("error", msg)
            print("(set HYDRA_FULL_ERROR=1 for the full traceback)", file=sys.stderr)
            sys.exit(EXIT_USER_ERROR)

    return wrapper


def hydra_output_subdir(run_dir: Any) -> str:
    """Where Hydra saves this run's config: ``.hydra`` for a new run folder, and
    ``.hydra/reruns/<time>`` when the folder already holds a run, so a rerun (whether it
    resumes, differs or fails) never overwrites the first run's ``.hydra/*.yaml``."""
    if not (Path(str(run_dir)) / ".hydra" / "config.yaml").exists():
        return ".hydra"
    return f".hydra/reruns/{time.strftime('%Y-%m-%d_%H-%M-%S')}_{os.getpid()}"


if not OmegaConf.has_resolver("edbatch_output_subdir"):
    OmegaConf.register_new_resolver("edbatch_output_subdir", hydra_output_subdir)
