"""Code hygiene the style guide asks for, checked on every run (STYLE 4: habits 2, 6, 7, 10)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = sorted(p for pkg in ("edbatch", "envs", "policies") for p in (ROOT / pkg).rglob("*.py"))
MAX_LINES = 450  # STYLE's budget is about 400 lines per module; this is the hard ceiling


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_declares_all_and_stays_small(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {t.id for node in tree.body if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name)}
    assert "__all__" in names, f"{path} has no __all__"
    assert len(path.read_text(encoding="utf-8").splitlines()) <= MAX_LINES


def test_only_tracking_imports_wandb_and_the_library_never_imports_hydra() -> None:
    for path in LIBRARY:
        text = path.read_text(encoding="utf-8")
        rel = str(path.relative_to(ROOT))
        if rel != "edbatch/tracking.py":
            assert "import wandb" not in text, rel
        assert "import hydra" not in text and "from hydra" not in text, rel
        assert "from omegaconf" not in text, rel


def test_benchmark_reference_keeps_one_latest_set_per_benchmark() -> None:
    """README: ``benchmarks/reference/`` holds the current result of each benchmark (and mode;
    ``train_model`` is the experiment entry point, ``gpu_tests`` the CUDA test log, a shell
    script such as ``gpu_fused_check.sh`` writes its own);
    older runs live in git, not beside it as dated copies."""
    files = sorted(p.name for p in (ROOT / "benchmarks" / "reference").iterdir())
    stale = [f for f in files if not f.split(".")[0].endswith("_latest")]
    assert files and not stale, f"not a *_latest result file: {stale}"
    writers = {p.stem for ext in ("py", "sh") for p in (ROOT / "benchmarks").glob(f"[a-z]*.{ext}")}
    writers |= {"gpu_tests", "train_model"}
    orphans = [f for f in files if not any(f.startswith(w) for w in writers)]
    assert not orphans, f"result files no benchmark script writes: {orphans}"
