"""Docs that cannot rot: every fenced command in README.md and docs/*.md is checked.

Fast part (default run): every ``python -m X`` module and script path a command shows
exists, Hydra entry points compose with the command's overrides (unknown keys, options and
config groups fail), argparse scripts define the flags shown, install commands name files
and extras that exist.

Slow part: every command runs from a copy of the repository, as written or as its cheap
variant in ``tests/docs_cheap.py`` (a tiny budget of the same command); a command without a
variant fails, so a new documented command must come with one. Self-contained ``python`` blocks
run too (:data:`FRAGMENTS` lists the markers of blocks that need the reader's own data).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_cheap import CHEAP, PY

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: markers of ``python`` blocks that use the reader's own data (covered by examples/).
FRAGMENTS = ("chunks",)


def _blocks(lang: str) -> list[tuple[str, str]]:
    """(file, block text) of every fenced block of ``lang`` in the docs."""
    out = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(rf"^```{lang}\n(.*?)^```", text, re.S | re.M):
            out.append((str(path.relative_to(ROOT)), m.group(1)))
    return out


def commands() -> list[tuple[str, str]]:
    """(file, command) of every bash command (continuations joined, comments dropped)."""
    out = []
    for name, block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append((name, " ".join(line.split())))
    return out


COMMANDS = commands()
IDS = [f"{f}:{c}" for f, c in COMMANDS]


def _parts(command: str) -> list[list[str]]:
    """The simple commands of a ``&&`` chain, env assignments dropped."""
    out = []
    for part in re.split(r"\s*&&\s*|\s*;\s*", command):
        words = shlex.split(part)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words = words[1:]
        out.append(words)
    return out


def _target(words: list[str]) -> tuple[str, str, list[str]] | None:
    """("module" | "script", name, args) of a python / torchrun invocation, else None."""
    if not words or not re.search(r"(python3?|torchrun)$", words[0]):
        return None
    rest = words[1:]
    for i, w in enumerate(rest):
        if w == "-m" and i + 1 < len(rest):
            return "module", rest[i + 1], rest[i + 2:]
        if w.endswith(".py"):
            return "script", w, rest[i + 1:]
    return None


def _hydra_config(module: str) -> str | None:
    """The entry point's config name; importing it registers any structured-config schemas
    (ConfigStore) it declares, as running it would."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    m = re.search(r"config_name=\"(\w+)\"", Path(spec.origin).read_text(encoding="utf-8"))
    if m:
        importlib.import_module(module)
    return m.group(1) if m else None


def _compose(config: str, args: list[str]) -> None:
    from hydra import compose, initialize_config_dir

    multirun = "-m" in args or "--multirun" in args
    overrides = []
    for a in args:
        if a.startswith("-") or "=" not in a:
            continue
        key, value = a.split("=", 1)
        if multirun and "," in value and not value.startswith("["):
            value = value.split(",")[0]  # a sweep: compose its first point
        overrides.append(f"{key}={value}")
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        compose(config_name=config, overrides=overrides, return_hydra_config=True)


def _script_source(path: Path) -> str:
    """A script's source and that of the repository's private modules it imports (where a
    script's command line lives, e.g. ``benchmarks/_throughput_cli.py``), each parsed."""
    source = path.read_text(encoding="utf-8")
    ast.parse(source)
    for module in re.findall(r"^from (benchmarks\._\w+) import", source, re.M):
        own = ROOT / (module.replace(".", "/") + ".py")
        text = own.read_text(encoding="utf-8")
        ast.parse(text)
        source += text
    return source


def test_the_docs_show_commands() -> None:
    assert len(COMMANDS) >= 10
    assert any("experiments.compare" in c for _, c in COMMANDS)


@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=IDS)
def test_command_targets_exist_and_accept_their_arguments(doc: str, command: str) -> None:
    for words in _parts(command):
        if words[:1] == ["python3"] and words[1:3] == ["-m", "venv"]:
            continue
        if words and words[0].endswith("pip"):
            assert (ROOT / words[words.index("-c") + 1]).is_file()
            extras = re.findall(r"\[([\w,]+)\]", " ".join(words))
            project = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
            declared = project.split("[project.optional-dependencies]")[1].split("\n[")[0]
            for extra in (e for group in extras for e in group.split(",")):
                assert re.search(rf"^{extra}\s*=", declared, re.M), \
                    f"{doc}: extra {extra!r} is not in pyproject.toml"
            continue
        target = _target(words)
        if target is None:
            continue
        kind, name, args = target
        if kind == "script":
            path = ROOT / name
            assert path.is_file(), f"{doc}: {name} does not exist"
            source = _script_source(path)
            for flag in (a.split("=")[0] for a in args if a.startswith("--")):
                assert f'"{flag}"' in source, f"{doc}: {name} defines no option {flag}"
            continue
        if name == "pytest":
            project = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
            for m in re.findall(r"\b(slow|gpu)\b", " ".join(args)):
                assert f'"{m}:' in project, f"{doc}: pytest marker {m!r} is not declared"
            continue
        assert importlib.util.find_spec(name) is not None, f"{doc}: no module {name}"
        config = _hydra_config(name)
        if config is not None:
            _compose(config, args)


def _skip_in_copy(folder: str, names: list[str]) -> set[str]:
    """Environments, outputs and caches, except numba's compiled core: every command runs
    in a fresh process, and the first would spend a minute or more recompiling it (not what
    these tests check). The caches are valid in the copy: numba keys them by the source's
    mtime and size, which ``copytree`` keeps, and ``edbatch._numba_cache`` stamps each folder
    with a hash of the sources, so a stale cache is deleted there as it is here."""
    skip = set(shutil.ignore_patterns(".git", ".venv", "runs", "outputs", "multirun",
                                      "results", ".pytest_cache", ".ruff_cache",
                                      "*.egg-info")(folder, names))
    if Path(folder).name == "__pycache__":
        from edbatch._numba_cache import STAMP

        return skip | {n for n in names if not n.endswith((".nbi", ".nbc")) and n != STAMP}
    return skip


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working tree without environments, outputs and caches (numba's kept)."""
    dest = tmp_path_factory.mktemp("repo") / "edbatch"
    shutil.copytree(ROOT, dest, ignore=_skip_in_copy)
    return dest


def _env(repo: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(repo), WANDB_MODE="disabled", HYDRA_FULL_ERROR="1")
    env.pop("PYTEST_ADDOPTS", None)
    return env


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=IDS)
def test_documented_command_runs(doc: str, command: str, repo_copy: Path) -> None:
    if command not in CHEAP:
        pytest.fail(f"{doc}: no cheap variant for the documented command\n  {command}\nadd one "
                    f"to CHEAP in tests/docs_cheap.py (same entry point, tiny budget)")
    cheap = CHEAP[command].replace(PY, shlex.quote(sys.executable))
    proc = subprocess.run(["bash", "-c", cheap], cwd=repo_copy, env=_env(repo_copy),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{doc}: `{cheap}` failed:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"


PYTHON_BLOCKS = [(f, b) for f, b in _blocks("python") if not any(m in b for m in FRAGMENTS)]


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "block"), PYTHON_BLOCKS,
                         ids=[f"{f}:{b.splitlines()[0][:40]}" for f, b in PYTHON_BLOCKS])
def test_documented_python_runs(doc: str, block: str, repo_copy: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", block], cwd=repo_copy, env=_env(repo_copy),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{doc}: block failed:\n{block}\n{proc.stderr[-3000:]}"


def test_every_cheap_variant_is_documented() -> None:
    shown = {c for _, c in COMMANDS}
    stale = [c for c in CHEAP if c not in shown]
    assert not stale, f"CHEAP has variants of commands no doc shows any more: {stale}"
