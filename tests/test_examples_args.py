"""The examples refuse a bad count in one usage line (``--batch-size 0`` was a raw
``range()`` error, ``--dim -3`` a tensor-shape error, ``--questions 0`` a division by zero)
and end an edbatch error in one ``error:`` line (:mod:`edbatch.cli`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from edbatch.cli import run
from edbatch.errors import UnknownNameError

ROOT = Path(__file__).resolve().parents[1]
COUNTS = {"char_tagger": "--sentences", "clevr_module_net": "--questions",
          "early_exit": "--batch-size", "greedy_decode": "--steps", "moe_routing": "--dim",
          "own_model": "--episodes", "sick_relatedness": "--pairs"}


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}",
                                                  ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(COUNTS))
@pytest.mark.parametrize("value", ["0", "-3", "abc"])
def test_a_bad_count_is_one_usage_line(name: str, value: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        _example(name).main([COUNTS[name], value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {COUNTS[name]}: invalid count {value!r}" in err and "Traceback" not in err


def test_run_ends_an_edbatch_error_in_one_line(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDBATCH_FULL_ERROR", raising=False)

    def main() -> None:
        raise UnknownNameError("unknown scheduler 'nosuch'")

    with pytest.raises(SystemExit) as e:
        run(main)
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[0] == "error: unknown scheduler 'nosuch'"
    monkeypatch.setenv("EDBATCH_FULL_ERROR", "1")
    with pytest.raises(UnknownNameError):
        run(main)
